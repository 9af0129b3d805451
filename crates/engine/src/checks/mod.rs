//! The validating checks: a pod after every mutator has run and the template ConfigMaps
//! (`validate`, behind `/validate`), and enforced templates, whose sidecars a pod's author cannot
//! skip, swap or fake (`enforce`) nor resize below what they set (`resize`); and the Pod Security
//! levels the API server will judge a pod by (`pod_security`).

pub mod enforce;
pub mod pod_security;
pub mod resize;
pub mod validate;
