//! Publishes the Kubernetes Events that admission decisions and template reloads call for
//! (`admission::events` decides them): off the request path, through one task, with
//! kube-runtime's `Recorder`, which aggregates a repeated Event into a series (one object whose
//! count grows) instead of one object per pod.
//!
//! Bounded cost: the queue holds [`QUEUE`] Events (more are dropped and counted); the same Event
//! (subject, reason) is published at most once per [`SAME_EVENT_EVERY`] (a ReplicaSet creating a
//! hundred conflicting pods makes one Event, not a hundred API calls); and at most
//! [`PER_SECOND`] Events a second reach the API server.
//!
//! A pod's owner is its claim: an Event goes on it only when an object of that kind, name and uid
//! exists (`admission::events::VerifiedOwners`); one metadata GET per owner a minute, by this
//! one task, at most [`OWNER_LOOKUP_TIMEOUT`] each. Otherwise the Event goes on nothing
//! (`owner_not_found`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::time::Instant;

use crate::admission::events::{EventIntent, VerifiedOwners, resource_of};
use crate::state::EventSink;
use crate::telemetry::Metrics;

/// Events waiting to be published.
pub const QUEUE: usize = 256;
/// The least time between two publications of the same Event.
pub const SAME_EVENT_EVERY: Duration = Duration::from_secs(30);
/// The most Events published a second.
pub const PER_SECOND: u32 = 10;
/// The longest wait for the API server to say whether a claimed owner exists.
pub const OWNER_LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts the publisher; the sink feeds it.
pub fn publish(client: Client, metrics: Arc<Metrics>) -> EventSink {
    let (sender, mut receiver) = tokio::sync::mpsc::channel::<EventIntent>(QUEUE);
    let instance = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_owned()))
        .filter(|n| !n.is_empty());
    let reporter = Reporter { controller: "sidecar-injector".into(), instance };
    let recorder = Recorder::new(client.clone(), reporter.clone());
    tokio::spawn(async move {
        let mut last: HashMap<(String, &'static str), Instant> = HashMap::new();
        let mut owners = VerifiedOwners::default();
        let spacing = Duration::from_secs(1) / PER_SECOND;
        while let Some(intent) = receiver.recv().await {
            let subject = intent.regarding.uid.clone().or_else(|| intent.regarding.name.clone()).unwrap_or_default();
            // A template edit's Event carries that edit's errors: each distinct one is its own Event
            // (a series would keep the first edit's note).
            let own_note = intent.action == "LoadTemplates";
            let note_part = if own_note { intent.note.clone() } else { String::new() };
            let key = (
                format!("{}/{subject}/{note_part}", intent.regarding.namespace.as_deref().unwrap_or_default()),
                intent.reason,
            );
            let now = Instant::now();
            if last.get(&key).is_some_and(|at| now.duration_since(*at) < SAME_EVENT_EVERY) {
                metrics.event("suppressed", 1);
                continue;
            }
            last.retain(|_, at| now.duration_since(*at) < SAME_EVENT_EVERY);
            last.insert(key, now);
            if !owner_exists(&client, &mut owners, &intent.regarding).await {
                metrics.event("owner_not_found", 1);
                tracing::debug!(reason = intent.reason, regarding = ?intent.regarding, "no Event: the pod's owner does not exist as claimed");
                continue;
            }
            let event = Event {
                type_: if intent.warning { EventType::Warning } else { EventType::Normal },
                reason: intent.reason.to_owned(),
                note: Some(intent.note),
                action: intent.action.to_owned(),
                secondary: None,
            };
            let fresh;
            let publisher = match own_note {
                true => {
                    fresh = Recorder::new(client.clone(), reporter.clone());
                    &fresh
                }
                false => &recorder,
            };
            match publisher.publish(&event, &intent.regarding).await {
                Ok(()) => metrics.event("published", 1),
                Err(error) => {
                    metrics.event("failed", 1);
                    tracing::warn!(%error, reason = intent.reason, "could not publish an Event");
                }
            }
            tokio::time::sleep(spacing).await;
        }
    });
    EventSink::to(sender)
}

/// Whether the subject of an Event exists as the Event names it. Subjects of the kinds a pod
/// claims as its owner (`admission::events::owner_kinds`) are looked up by name and compared by
/// uid (a failed lookup counts as not found, and is asked again next time); any other subject is
/// the injector's own (a template ConfigMap from its watch).
async fn owner_exists(client: &Client, seen: &mut VerifiedOwners, regarding: &ObjectReference) -> bool {
    let (api_version, kind) = (regarding.api_version.as_deref().unwrap_or_default(), regarding.kind.as_deref());
    let Some(resource) = kind.and_then(|kind| resource_of(api_version, kind)) else { return true };
    let Some(key) = VerifiedOwners::key(regarding) else { return false };
    if let Some(exists) = seen.get(&key, std::time::Instant::now()) {
        return exists;
    }
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, &key.1);
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &key.0, &ApiResource::from_gvk_with_plural(&gvk, resource));
    match tokio::time::timeout(OWNER_LOOKUP_TIMEOUT, api.get_metadata_opt(&key.2)).await {
        Ok(Ok(found)) => {
            let exists = found.is_some_and(|o| o.metadata.uid.as_deref() == Some(key.3.as_str()));
            seen.insert(key, exists, std::time::Instant::now());
            exists
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, kind = key.1, name = key.2, "could not look up a pod's owner for an Event");
            false
        }
        Err(_) => false,
    }
}
