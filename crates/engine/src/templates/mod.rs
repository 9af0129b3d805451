//! Templates: what operators write and what it becomes once compiled. The compiled form
//! (`template`), the compiler that makes it from the YAML (`compiler`), the expressions inside it
//! (`expression`), the set of templates in service with the versions it remembers (`set`), and
//! which version a pod gets while a new one rolls out (`rollout`). The checks a template passes
//! before it serves are `checks::load`; the YAML reader is `model::yaml`.

pub mod compiler;
pub mod expression;
pub mod rollout;
pub mod set;
pub mod template;
