//! Checks the decision makes of one rendering, and that a template passes before it serves:
//! enforced templates, whose sidecars a pod's author cannot skip, swap or fake (`enforce`) nor
//! resize below the floor they set (`resize`); the Pod Security levels the API server will judge
//! a pod by (`pod_security`); and a template's test renders before it serves (`load`). The checks
//! that recompute a decision (`/validate`, updates) are above the decision, in `review`.

pub mod enforce;
pub(crate) mod load;
pub mod pod_security;
pub mod resize;
