//! The injection, in the order a pod meets it: which pods and templates are in scope (`select`),
//! a template rendered for one pod (`render`), the plan of what to add and the JSONPatch that
//! writes it (`plan`), and the decisions the plan asks of its own modules: how items are
//! identified and compared (`compare`), native or classic sidecars (`native`, with what the nodes
//! run in `nodes`, the features they declare in `node_features`), image volumes or their declared fallback (`image_volumes`), adding to an env
//! var the app already has (`env_merge`), pod-level resources (`pod_resources`), the API server's
//! rules the additions could break (`api_limits`) and ports the added containers share with
//! others (`ports`).

pub mod env_merge;
pub mod image_volumes;
pub mod node_features;
pub mod node_index;
pub mod nodes;
pub mod plan;
pub mod pod_resources;
pub mod ports;
pub mod render;
pub mod select;

#[cfg(test)]
mod env_merge_tests;
