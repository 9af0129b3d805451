//! AdmissionReview in, engine decision, AdmissionReview out: pure functions over
//! `kube::core::admission` types, shared by the HTTP handlers and the tests.
//!
//! Parsing takes one pass on the happy path: kube's `AdmissionReview<T>` flattens its type meta,
//! which makes serde buffer the whole body before deserializing it (a second pass over a pod that
//! may be hundreds of KiB), so the review is read into a small envelope holding kube's
//! `AdmissionRequest<RawObject>` directly, where [`RawObject`] keeps the object as the raw JSON the
//! engine works on. Only when that fails is the body read again to say precisely what is wrong:
//! apiVersion and kind first, then the path of the bad field.

use std::borrow::Cow;
use std::sync::Arc;

use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::{ApiResource, DynamicResourceScope, ObjectMeta, Resource, TypeMeta};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::engine::review::validate::{self, Verdict};
use crate::engine::templates::set::PreCheck;
use crate::engine::{ClusterFacts, Engine, NamespaceFacts, Outcome, PodRequest, WarningCode, names};

/// The only AdmissionReview version served.
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// The kind of the review.
pub const KIND: &str = "AdmissionReview";

/// An object of a kind known only at run time, kept as raw JSON so that fields unknown to our
/// Kubernetes types survive. Its typed metadata (for the `Resource` trait) is parsed on first use.
#[derive(Debug, Clone)]
pub struct RawObject {
    /// The object as sent.
    pub json: Value,
    metadata: std::sync::OnceLock<ObjectMeta>,
}

impl RawObject {
    fn parsed_metadata(&self) -> ObjectMeta {
        self.json.get("metadata").and_then(|m| ObjectMeta::deserialize(m).ok()).unwrap_or_default()
    }
}

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(RawObject { json: Value::deserialize(deserializer)?, metadata: std::sync::OnceLock::new() })
    }
}

impl serde::Serialize for RawObject {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(serializer)
    }
}

impl Resource for RawObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }
    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }
    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }
    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }
    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }
    fn meta(&self) -> &ObjectMeta {
        self.metadata.get_or_init(|| self.parsed_metadata())
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        if self.metadata.get().is_none() {
            let _ = self.metadata.set(self.parsed_metadata());
        }
        self.metadata.get_mut().expect("just set")
    }
}

/// A parsed admission request.
pub type Request = AdmissionRequest<RawObject>;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /mutate`.
    Mutate,
    /// `POST /validate`.
    Validate,
}

impl Endpoint {
    /// `mutate` or `validate`, for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Mutate => "mutate",
            Endpoint::Validate => "validate",
        }
    }
}

/// An HTTP answer: status, AdmissionReview body, and what happened, for logs and metrics.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status: 200, or 400 (unreadable review), 408 (body too slow), 413 (body too large).
    pub status: u16,
    /// JSON body.
    pub body: Vec<u8>,
    /// What happened.
    pub summary: Summary,
}

/// What happened to one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// `CREATE`, `UPDATE`, ... (`unknown` when unreadable).
    pub operation: String,
    /// `patched`, `allowed`, `denied`, `invalid`, `too_large` or `timeout`.
    pub result: &'static str,
    /// The human reason (why allowed without patch, why denied, what is invalid).
    pub reason: String,
    /// Templates injected, every item of them (mutate).
    pub injected: Vec<String>,
    /// Templates applied with conflicts (mutate): the pod's own items stand where some of theirs
    /// would be.
    pub conflicted: Vec<String>,
    /// Templates marked `enforced: audit` that `enforced: true` would have made refuse the pod, or
    /// inject into it against its annotations (mutate).
    pub audited: Vec<String>,
    /// Kubernetes Events to publish about it (none for a dry run; see `events`).
    pub events: Vec<events::EventIntent>,
    /// The codes of the decision's warnings (`engine::WarningCode::as_str`), for the warnings
    /// metric.
    pub warnings: Vec<&'static str>,
    /// Short code of a skip, for the skips metric (`not_a_pod`, `not_create`, `namespace_not_opted_in`,
    /// `up_to_date`, `no_template_matched`, ...).
    pub skip: Option<&'static str>,
    /// An in-place resize (`pods/resize`), for the resizes metric.
    pub resize: bool,
}

/// Why a body is not a readable AdmissionReview: the message of the 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest(pub String);

#[derive(Deserialize)]
struct Review {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
    request: Option<Request>,
}

fn check_types(api_version: Option<&str>, kind: Option<&str>) -> Result<(), BadRequest> {
    let bad = |m: String| Err(BadRequest(m));
    match api_version {
        Some(API_VERSION) => {}
        Some(other) => return bad(format!("unsupported apiVersion {other:?}: only {API_VERSION} is served")),
        None => return bad(format!("apiVersion is missing: expected {API_VERSION}")),
    }
    match kind {
        Some(KIND) => Ok(()),
        Some(other) => bad(format!("unsupported kind {other:?}: expected {KIND}")),
        None => bad(format!("kind is missing: expected {KIND}")),
    }
}

/// Reads an AdmissionReview, with a specific message for every way it can be wrong.
pub fn parse(body: &[u8]) -> Result<Request, BadRequest> {
    let text = std::str::from_utf8(body)
        .map_err(|e| BadRequest(format!("the body is not UTF-8: invalid byte at offset {}", e.valid_up_to())))?;
    let review: Review = serde_json::from_str(text).map_err(|e| diagnose(text, e))?;
    check_types(review.api_version.as_deref(), review.kind.as_deref())?;
    let mut request = review.request.ok_or_else(|| BadRequest("the AdmissionReview has no request".into()))?;
    if request.uid.is_empty() {
        return Err(BadRequest("request.uid is missing".into()));
    }
    if matches!(request.operation, Operation::Create | Operation::Update) && request.object.is_none() {
        return Err(BadRequest("request.object is missing".into()));
    }
    request.types = TypeMeta { api_version: API_VERSION.into(), kind: KIND.into() };
    Ok(request)
}

/// Says what is wrong with a body that did not parse: not JSON at all, apiVersion or kind (before
/// anything in the request), then the request's first bad field with its path.
fn diagnose(text: &str, error: serde_json::Error) -> BadRequest {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(rename = "apiVersion")]
        api_version: Option<String>,
        kind: Option<String>,
        #[serde(borrow)]
        request: Option<&'a RawValue>,
    }
    if error.is_syntax() || error.is_eof() {
        return BadRequest(format!("the body is not valid JSON: {error}"));
    }
    let envelope: Envelope = match serde_json::from_str(text) {
        Ok(envelope) => envelope,
        Err(e) if e.is_data() => return BadRequest(format!("the body is not an AdmissionReview: {e}")),
        Err(e) => return BadRequest(format!("the body is not valid JSON: {e}")),
    };
    if let Err(bad) = check_types(envelope.api_version.as_deref(), envelope.kind.as_deref()) {
        return bad;
    }
    let Some(raw) = envelope.request else { return BadRequest(format!("the body is not an AdmissionReview: {error}")) };
    let mut deserializer = serde_json::Deserializer::from_str(raw.get());
    match serde_path_to_error::deserialize::<_, Request>(&mut deserializer) {
        Ok(_) => BadRequest(format!("request: {error}")),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let message = inner.to_string();
            match message.strip_prefix("missing field `").and_then(|m| m.split('`').next()) {
                Some(field) if path == "." => BadRequest(format!("request.{field} is missing")),
                _ if path == "." => BadRequest(format!("request: {message}")),
                _ => BadRequest(format!("request.{path}: {message}")),
            }
        }
    }
}

/// The review body of a response, written in one pass. kube's `AdmissionResponse` serializes the
/// patch bytes as a JSON array of numbers; the API server would accept that, but the documented
/// wire format (and a third of the size) is base64, so the response is written field by field here.
/// `patch` is serialized straight from the operations, and its base64 text goes into the body as it
/// stands: the base64 alphabet needs no JSON escaping, so scanning it for escapes (as a string
/// field would) is wasted work on the largest field of an injected answer.
fn encode(response: AdmissionResponse, patch: Option<&[json_patch::PatchOperation]>) -> Vec<u8> {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Wire<'a> {
        api_version: &'static str,
        kind: &'static str,
        response: WireResponse<'a>,
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct WireResponse<'a> {
        uid: &'a str,
        allowed: bool,
        status: &'a kube::core::Status,
        #[serde(skip_serializing_if = "Option::is_none")]
        patch: Option<Box<RawValue>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        patch_type: Option<&'static str>,
        #[serde(skip_serializing_if = "std::collections::HashMap::is_empty")]
        audit_annotations: &'a std::collections::HashMap<String, String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        warnings: Option<&'a Vec<String>>,
    }
    let patch = patch.map(|operations| {
        let json = serde_json::to_vec(operations).expect("a patch serializes");
        let mut quoted = String::with_capacity(json.len().div_ceil(3) * 4 + 2);
        quoted.push('"');
        base64_simd::STANDARD.encode_append(&json, &mut quoted);
        quoted.push('"');
        RawValue::from_string(quoted).expect("quoted base64 is a JSON string")
    });
    let capacity = patch.as_ref().map_or(0, |p| p.get().len()) + 512;
    let wire = Wire {
        api_version: API_VERSION,
        kind: KIND,
        response: WireResponse {
            uid: &response.uid,
            allowed: response.allowed,
            status: &response.result,
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            audit_annotations: &response.audit_annotations,
            warnings: response.warnings.as_ref(),
        },
    };
    let mut body = Vec::with_capacity(capacity);
    serde_json::to_writer(&mut body, &wire).expect("a review serializes");
    body
}

/// The 400 answer to an unreadable review.
pub fn invalid(error: &BadRequest) -> Reply {
    failure(400, "invalid", &error.0)
}

/// The 413 answer to a body over `limit` bytes.
pub fn too_large(limit: usize) -> Reply {
    failure(
        413,
        "too_large",
        &format!("the request body is larger than the limit of {limit} bytes (server.max_body_bytes)"),
    )
}

/// The 408 answer to a body that did not arrive in time.
pub fn body_timeout(timeout: std::time::Duration) -> Reply {
    failure(408, "timeout", &format!("the request body did not arrive within {} ms", timeout.as_millis()))
}

/// The 503 answer when the bytes of requests already in flight leave no room for this one in time.
pub fn busy(inflight_limit: usize, waited: std::time::Duration) -> Reply {
    failure(
        503,
        "busy",
        &format!(
            "too many request bytes in flight (server.max_inflight_bytes = {inflight_limit}); no room within {} ms (server.room_wait_ms); retry",
            waited.as_millis()
        ),
    )
}

fn failure(status: u16, result: &'static str, message: &str) -> Reply {
    Reply {
        status,
        body: encode(AdmissionResponse::invalid(message), None),
        summary: Summary { operation: "unknown".into(), result, reason: message.to_owned(), ..Summary::default() },
    }
}

fn operation_name(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// Whether `/validate` would check this request as a template ConfigMap (the slow, isolated path:
/// the caller runs it off the async workers, one at a time).
pub fn is_configmap(request: &Request) -> bool {
    is_kind(request, "", "ConfigMap")
}

/// The refusal when another template check is still running: fast and clear, so the user retries.
pub fn template_check_busy(request: &Request, waited: std::time::Duration) -> Reply {
    deny(
        request,
        format!(
            "another template check has been running for over {} s; templates are checked one at a time: try again in a few seconds",
            waited.as_secs()
        ),
    )
}

/// Whether the request is about objects of this API group and kind.
pub fn is_kind(request: &Request, group: &str, kind: &str) -> bool {
    request.kind.group == group && request.kind.kind == kind
}

fn reply(response: AdmissionResponse, summary: Summary) -> Reply {
    Reply { status: 200, body: encode(response, None), summary }
}

fn allow(request: &Request, skip: &'static str, reason: impl Into<String>) -> Reply {
    let summary = Summary {
        operation: operation_name(&request.operation).into(),
        result: "allowed",
        reason: reason.into(),
        skip: Some(skip),
        ..Summary::default()
    };
    reply(AdmissionResponse::from(request), summary)
}

fn with_warnings(mut response: AdmissionResponse, warnings: Vec<String>) -> AdmissionResponse {
    if !warnings.is_empty() {
        response.warnings = Some(warnings.into_iter().map(|w| format!("sidecar-injector: {w}")).collect());
    }
    response
}

/// The pod namespace: the request's (the object's may be empty on CREATE).
pub fn namespace_of(request: &Request) -> &str {
    request.namespace.as_deref().unwrap_or_default()
}

/// `POST /mutate`: patches pods on CREATE; everything else is allowed unchanged. A dry-run is
/// mutated like a real request (the webhook has no side effects).
pub fn mutate(engine: &Engine, request: Request, namespace: &NamespaceFacts, cluster: ClusterFacts) -> Reply {
    if !is_kind(&request, "", "Pod") {
        let kind = format!("{}/{}", request.kind.group, request.kind.kind);
        return allow(&request, "not_a_pod", format!("{kind} is not a Pod"));
    }
    if request.operation != Operation::Create {
        return allow(
            &request,
            "not_create",
            format!("only CREATE is mutated, not {}", operation_name(&request.operation)),
        );
    }
    let mut request = request;
    let object = request.object.take().expect("parse checked that CREATE carries an object");
    // Events go on the pod's owner, and never for a dry run.
    let owner = (!request.dry_run).then(|| events::owner_of(&object.json, &namespace.name)).flatten();
    let pod_name = crate::engine::pod::display_name(&object.json);
    let pod = PodRequest { pod: Arc::new(object.json), namespace: namespace.clone(), cluster, workload: None };
    let decision = engine.evaluate(&pod);
    let mut intents = Vec::new();
    if let Some(owner) = &owner {
        // One Warning Event per code that has a reason, with every message of that code.
        for code in WarningCode::ALL {
            let Some(reason) = code.event_reason() else { continue };
            let messages: Vec<&str> =
                decision.warnings.iter().filter(|w| w.code == code).map(|w| w.message.as_str()).collect();
            intents.extend(events::warnings(owner, &pod_name, reason, &messages));
        }
        match &decision.outcome {
            Outcome::Inject(injection) => intents.extend(events::conflicts(owner, &pod_name, &injection.status)),
            Outcome::Denied(denial) => intents.push(events::refused(owner, &pod_name, &denial.to_string())),
            Outcome::OutOfScope(_) | Outcome::UpToDate(_) => {}
        }
    }
    let operation = "CREATE".to_owned();
    let base = AdmissionResponse::from(&request);
    let audited = decision.audited;
    let warning_codes: Vec<&'static str> = decision.warnings.iter().map(|w| w.code.as_str()).collect();
    let warnings: Vec<String> = decision.warnings.into_iter().map(|w| w.message).collect();
    let mut reply = match decision.outcome {
        Outcome::OutOfScope(reason) => {
            let mut reply = allow(&request, reason.code(), reason.to_string());
            if !warnings.is_empty() {
                reply.body = encode(with_warnings(base, warnings), None);
            }
            reply.summary.audited = audited;
            reply
        }
        Outcome::UpToDate(_) => allow(&request, "up_to_date", "already injected with the current templates"),
        Outcome::Inject(injection) => {
            let status = &injection.status;
            let conflicted: Vec<String> = status.conflicted_templates().into_iter().map(str::to_owned).collect();
            let injected: Vec<String> =
                status.templates.iter().map(|t| t.name.clone()).filter(|n| !conflicted.contains(n)).collect();
            let (skip, reason) = match (&injection.skipped_as, &status.reason) {
                (Some(skipped), _) => (Some(skipped.code()), skipped.to_string()),
                (None, Some(reason)) if injected.is_empty() && conflicted.is_empty() => {
                    (Some("no_template_matched"), reason.clone())
                }
                // Some templates injected, others left out (Pod Security).
                (None, Some(reason)) => (
                    None,
                    format!(
                        "injected {}; {reason}",
                        status.templates.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                ),
                (None, None) if conflicted.is_empty() => (None, format!("injected {}", injected.join(", "))),
                (None, None) => (
                    None,
                    format!(
                        "injected [{}], applied with conflicts [{}] (the pod's own items stand)",
                        injected.join(", "),
                        conflicted.join(", ")
                    ),
                ),
            };
            let response = with_warnings(base, warnings);
            let body = encode(response, Some(&injection.patch));
            let summary = Summary {
                operation,
                result: "patched",
                reason,
                injected,
                conflicted,
                audited,
                skip,
                ..Summary::default()
            };
            Reply { status: 200, body, summary }
        }
        Outcome::Denied(denial) => {
            let message = denial.to_string();
            let response = with_warnings(base, warnings).deny(&message);
            reply(response, Summary { operation, result: "denied", reason: message, ..Summary::default() })
        }
    };
    reply.summary.events = intents;
    reply.summary.warnings = warning_codes;
    reply
}

/// `POST /validate`: pods on CREATE (the injection happened and survived every mutator) and UPDATE
/// (what the injection added stays as injected), and the
/// template ConfigMaps in `own_namespace` on CREATE and UPDATE (every template passes `precheck`
/// and loads).
pub fn validate(
    engine: &Engine,
    mut request: Request,
    namespace: &NamespaceFacts,
    cluster: ClusterFacts,
    own_namespace: &str,
    precheck: &dyn PreCheck,
) -> Reply {
    let operation = operation_name(&request.operation).to_owned();
    let resize = request.sub_resource.as_deref() == Some("resize");
    let mut audited = Vec::new();
    let verdict = if is_kind(&request, "", "Pod") {
        // The pod is moved into the check, not copied: the reply needs only the request's identity.
        match (&request.operation, request.object.take(), &request.old_object) {
            (Operation::Create, Some(object), _) => validate::validate_pod(
                engine,
                &PodRequest { pod: Arc::new(object.json), namespace: namespace.clone(), cluster, workload: None },
            ),
            (Operation::Update, Some(object), Some(old)) => {
                let pod =
                    PodRequest { pod: Arc::new(object.json), namespace: namespace.clone(), cluster, workload: None };
                let checked = validate::validate_pod_update(engine, &old.json, &pod);
                audited = checked.audited;
                checked.verdict
            }
            (Operation::Update, _, None) => {
                return deny(&request, "request.oldObject is missing for a pod UPDATE".into());
            }
            _ => {
                return allow(
                    &request,
                    "not_create",
                    format!("pods are checked on CREATE and UPDATE, not {operation}"),
                );
            }
        }
    } else if is_kind(&request, "", "ConfigMap") {
        let Some(object) =
            request.object.as_ref().filter(|_| matches!(request.operation, Operation::Create | Operation::Update))
        else {
            return allow(
                &request,
                "not_create",
                format!("template ConfigMaps are checked on CREATE and UPDATE, not {operation}"),
            );
        };
        let labelled =
            object.meta().labels.as_ref().and_then(|l| l.get(names::TEMPLATES_CONFIGMAP_LABEL)).map(String::as_str)
                == Some("true");
        if namespace_of(&request) != own_namespace || !labelled {
            return allow(&request, "not_templates", "not a template ConfigMap");
        }
        let data: std::collections::BTreeMap<String, String> = match object.json.get("data") {
            None | Some(Value::Null) => Default::default(),
            Some(data) => match serde_json::from_value(data.clone()) {
                Ok(data) => data,
                Err(e) => return deny(&request, format!("data: {e}")),
            },
        };
        match validate::validate_template_data(&data, precheck) {
            Ok(warnings) => Verdict::Allowed(warnings),
            Err(errors) => {
                let message = format!(
                    "ConfigMap {} has invalid templates: {}",
                    request.name,
                    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
                );
                let mut reply = deny(&request, message.clone());
                if !request.dry_run {
                    let uid = request.old_object.as_ref().and_then(|old| old.meta().uid.clone());
                    let regarding = events::configmap(own_namespace, &request.name, uid);
                    reply.summary.events.push(events::template_edit(regarding, true, &message));
                }
                return reply;
            }
        }
    } else {
        let kind = format!("{}/{}", request.kind.group, request.kind.kind);
        return allow(&request, "not_a_pod", format!("{kind} is not validated"));
    };
    let mut reply = match verdict {
        Verdict::Allowed(warnings) => {
            let response = with_warnings(AdmissionResponse::from(&request), warnings);
            reply(
                response,
                Summary { operation, result: "allowed", reason: "valid".into(), audited, ..Summary::default() },
            )
        }
        Verdict::Denied(message) => deny(&request, message),
    };
    reply.summary.resize = resize;
    reply
}

fn deny(request: &Request, message: String) -> Reply {
    let response = AdmissionResponse::from(request).deny(format!("sidecar-injector: {message}"));
    let summary = Summary {
        operation: operation_name(&request.operation).into(),
        result: "denied",
        reason: message,
        ..Summary::default()
    };
    reply(response, summary)
}

pub mod events;

#[cfg(test)]
mod tests;
