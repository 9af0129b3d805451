//! Templates: what operators write and what it becomes once loaded. The YAML format and its
//! compiled form (`template`), the expressions inside it (`expression`), the YAML reader templates
//! use (`yaml`), and the checks a template passes before it serves (`load`: test renders;
//! `conformance`: every rendered item is its Kubernetes type, strictly).

pub mod expression;
pub mod template;
