//! The engine's vocabulary, below every step that uses it: the kinds of items a template adds
//! (`kinds`), the status annotation that records them (`status`), what Kubernetes requires of them
//! (`conformance`: each rendered item is its Kubernetes type; `api_limits`: the API server's
//! validation rules), how an item of the pod and one of a template are compared (`compare`), env
//! values as the kubelet expands them (`env`), native and classic sidecars (`native`), containers
//! sized from the app's resources (`sizing`), and the YAML reader templates and manifests use
//! (`yaml`). Nothing here knows a template set, a plan or a
//! decision.

pub mod api_limits;
pub mod compare;
pub mod conformance;
pub mod env;
pub mod kinds;
pub mod native;
pub mod sizing;
pub mod status;
pub mod yaml;
