//! Claims: what the injector says it did to a pod (the status annotation, `status`), which of
//! those claims the pod proves (`ownership`), and the pod without what they name (`strip`). A pod is untrusted input, so nothing is removed or
//! rewritten on a claim alone: re-injection, strip, `/validate` and enforcement act only on what
//! `ownership` proves. The versions a claim names are found by `versions`.

pub mod ownership;
pub mod strip;
pub mod versions;
