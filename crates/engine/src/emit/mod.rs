//! What the engine writes for the API server to run, and how the API server reads what we ship:
//! the injector's scope as selectors and match conditions, the one statement of it that the
//! generated objects use and the shipped manifests are checked against (`scope`), templates
//! compiled into a MutatingAdmissionPolicy (`policy`, the policy mode), and the rules of the
//! shipped MutatingWebhookConfiguration as the API server applies them before the webhook is even
//! called (`webhook_rules`).

pub mod policy;
pub mod scope;
pub mod webhook_rules;
