//! Sidecars sized from the app they serve: a template's container may say `sizing:`, computing
//! its requests and limits from the pod's app containers (`spec.containers` as the author wrote
//! them) instead of a fixed number:
//!
//! ```yaml
//! sizing:
//!   requests:
//!     cpu: {from: sum, fraction: 0.1, min: 10m, max: "1", round: 1m}
//!   limits:
//!     memory: {from: max, fraction: 0.5, min: 64Mi, max: 1Gi, round: 1Mi}
//! ```
//!
//! The value is the sum (or the largest) of the app containers' value of the same field and
//! resource, times `fraction`, rounded **up** to a multiple of `round` (default `1m` for `cpu`, `1`
//! for any other resource), then held between `min` and `max`; it is written as the API server
//! stores a quantity of `round`'s unit (`70m`, `1`, `160Mi`). App requests are read as
//! Kubernetes defaults them: a container without a request counts with its limit. A limit sized
//! from app containers of which one has no limit (it may use the whole node) is `max`. Where no
//! app container says anything to size from, the value is `min`, or else the template's own
//! value (its `resources`, possibly none). A sized request never exceeds the container's limit of
//! the same resource (the API server refuses that): it is held there; a sized limit never goes
//! below a request the template fixes: it is raised to it. The notes say so.
//! Arithmetic is exact (nano-units in `i128`); a value that overflows is an error that names the
//! container, never a wrapped number.
//!
//! Pure: [`Sizing::parse`] reads the literal `sizing:` at load, [`Sizing::apply`] sizes one
//! rendered container for one pod and says how, for `explain`.

use serde_json::{Map, Value};

use crate::quantity;

/// The `sizing:` of one container, read at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizing {
    rules: Vec<Rule>,
}

/// One sized value: `<field>.<resource>`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    field: Field,
    resource: String,
    from: From,
    /// The fraction in nano-units (`0.1` is 100,000,000).
    fraction: i128,
    fraction_text: String,
    min: Option<Bound>,
    max: Option<Bound>,
    round: Bound,
}

/// A quantity as written and as nano-units.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bound {
    nanos: i128,
    text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Requests,
    Limits,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Requests => "requests",
            Field::Limits => "limits",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum From {
    Sum,
    Max,
}

/// What the app containers hold of one field and resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AppValue {
    /// None of them says anything.
    Nothing,
    /// A limit and one container without one: unbounded.
    Unbounded,
    /// The sum or the largest, in nano-units.
    Nanos(i128),
}

const NANO: i128 = 1_000_000_000;

impl Sizing {
    /// Reads a `sizing:` value (literal YAML as JSON); the error says what is wrong in the
    /// template author's terms.
    pub fn parse(value: &Value) -> Result<Sizing, String> {
        let expected = "sizing must be {requests: {<resource>: <rule>}, limits: {<resource>: <rule>}}";
        let Some(fields) = value.as_object() else { return Err(format!("{expected}, not {}", kind_of(value))) };
        let mut rules = Vec::new();
        for (field, resources) in fields {
            let field = match field.as_str() {
                "requests" => Field::Requests,
                "limits" => Field::Limits,
                other => return Err(format!("unknown key {other:?} in sizing (expected requests, limits)")),
            };
            let Some(resources) = resources.as_object().filter(|r| !r.is_empty()) else {
                return Err(format!(
                    "sizing.{} must map resources to rules, like {{cpu: {{from: sum, fraction: 0.1}}}}",
                    field.name()
                ));
            };
            for (resource, rule) in resources {
                let at = format!("sizing.{}.{resource}", field.name());
                rules.push(Rule::parse(field, resource, rule).map_err(|why| format!("{at}: {why}"))?);
            }
        }
        if rules.is_empty() {
            return Err(format!("{expected}: it sizes nothing"));
        }
        Ok(Sizing { rules })
    }

    /// The values its rules decide, as `(field, resource)` (`("requests", "cpu")`).
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.rules.iter().map(|rule| (rule.field.name(), rule.resource.as_str()))
    }

    /// Sizes `container` (a rendered container) from `app` (the pod's `spec.containers`): sets
    /// each sized value in its `resources`, and returns one note per value saying how it was
    /// computed.
    pub fn apply(&self, container: &mut Value, app: &[Value]) -> Result<Vec<String>, String> {
        let name = container.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let mut notes = Vec::with_capacity(self.rules.len());
        // Limits first: a sized request is held at the container's limit.
        let ordered = self
            .rules
            .iter()
            .filter(|r| r.field == Field::Limits)
            .chain(self.rules.iter().filter(|r| r.field == Field::Requests));
        for rule in ordered {
            let at = format!("container {name}: {}.{}", rule.field.name(), rule.resource);
            let from_app = rule.app_value(app).map_err(|why| format!("{at}: {why}"))?;
            let (mut nanos, how) = match rule.size(from_app).map_err(|why| format!("{at}: {why}"))? {
                Ok(sized) => sized,
                Err(why) => {
                    notes.push(format!("{at} stays the template's: {why}"));
                    continue;
                }
            };
            // The API server refuses a request above the limit: a sized request is held at the
            // limit, a sized limit raised to a request the template fixes.
            let mut held = String::new();
            match rule.field {
                Field::Requests => {
                    if let Some(limit) = resource_of(container, Field::Limits, &rule.resource).and_then(quantity::of)
                        && nanos > limit
                    {
                        nanos = limit;
                        held = ", held at the container's limit".to_owned();
                    }
                }
                Field::Limits => {
                    // A request rule that falls back to the template's value leaves that value.
                    let request_sized = self.rules.iter().any(|r| {
                        r.field == Field::Requests
                            && r.resource == rule.resource
                            && r.app_value(app).and_then(|v| r.size(v)).is_ok_and(|sized| sized.is_ok())
                    });
                    if !request_sized
                        && let Some(request) =
                            resource_of(container, Field::Requests, &rule.resource).and_then(quantity::of)
                        && nanos < request
                    {
                        nanos = request;
                        held = ", raised to the container's request".to_owned();
                    }
                }
            }
            let text = quantity::format(nanos, &rule.round.text);
            set_resource(container, rule.field, &rule.resource, &text);
            notes.push(format!("{at} = {text} ({how}{held})"));
        }
        Ok(notes)
    }
}

impl Rule {
    fn parse(field: Field, resource: &str, rule: &Value) -> Result<Rule, String> {
        let expected =
            "a rule is {from: sum or max, fraction: <number>, min: <quantity>, max: <quantity>, round: <quantity>}";
        let Some(keys) = rule.as_object() else { return Err(format!("{expected}, not {}", kind_of(rule))) };
        if let Some(unknown) = keys.keys().find(|k| !["from", "fraction", "min", "max", "round"].contains(&k.as_str()))
        {
            return Err(format!("unknown key {unknown:?} ({expected})"));
        }
        let from = match keys.get("from").and_then(Value::as_str) {
            Some("sum") => From::Sum,
            Some("max") => From::Max,
            _ => {
                return Err(format!(
                    "from must be sum or max, not {}",
                    keys.get("from").map_or("missing".to_owned(), |v| v.to_string())
                ));
            }
        };
        let fraction_value = keys.get("fraction").ok_or("fraction is missing (1 takes the app's value as it is)")?;
        let fraction_text =
            quantity::text(fraction_value).filter(|t| t.bytes().all(|b| b.is_ascii_digit() || b == b'.'));
        let fraction = fraction_text.as_deref().and_then(quantity::parse).filter(|f| *f > 0);
        let (Some(fraction), Some(fraction_text)) = (fraction, fraction_text) else {
            return Err(format!("fraction must be a positive decimal number like 0.25, not {fraction_value}"));
        };
        let bound = |key: &str| -> Result<Option<Bound>, String> {
            let Some(value) = keys.get(key) else { return Ok(None) };
            let text = quantity::text(value).ok_or_else(|| format!("{key} must be a quantity, not {value}"))?;
            let nanos = quantity::parse(&text)
                .filter(|n| *n >= 0)
                .ok_or_else(|| format!("{key} must be a quantity, not {value}"))?;
            Ok(Some(Bound { nanos, text: text.into_owned() }))
        };
        let (min, max) = (bound("min")?, bound("max")?);
        if let (Some(min), Some(max)) = (&min, &max)
            && min.nanos > max.nanos
        {
            return Err(format!("min {} is more than max {}", min.text, max.text));
        }
        let round = match bound("round")? {
            Some(round) if round.nanos > 0 => round,
            Some(round) => return Err(format!("round must be more than zero, not {}", round.text)),
            None if resource == "cpu" => Bound { nanos: NANO / 1000, text: "1m".to_owned() },
            None => Bound { nanos: NANO, text: "1".to_owned() },
        };
        Ok(Rule {
            field,
            resource: resource.to_owned(),
            from,
            fraction,
            fraction_text: fraction_text.into_owned(),
            min,
            max,
            round,
        })
    }

    /// What the app containers hold of this rule's field and resource.
    fn app_value(&self, app: &[Value]) -> Result<AppValue, String> {
        let mut total: Option<i128> = None;
        let mut unbounded = false;
        for container in app {
            let own = resource_of(container, self.field, &self.resource);
            // Kubernetes defaults a missing request to the limit.
            let value = match self.field {
                Field::Requests => own.or_else(|| resource_of(container, Field::Limits, &self.resource)),
                Field::Limits => own,
            };
            let Some(value) = value else {
                unbounded |= self.field == Field::Limits;
                continue;
            };
            let name = container.get("name").and_then(Value::as_str).unwrap_or_default();
            let nanos = quantity::of(value).ok_or_else(|| {
                format!(
                    "app container {name} has {}.{} {value}, which is no quantity",
                    self.field.name(),
                    self.resource
                )
            })?;
            if nanos < 0 {
                return Err(format!(
                    "app container {name} has {}.{} {value}, which is negative",
                    self.field.name(),
                    self.resource
                ));
            }
            total = Some(match (total, self.from) {
                (None, _) => nanos,
                (Some(sum), From::Sum) => sum.checked_add(nanos).ok_or("the app containers' sum overflows")?,
                (Some(largest), From::Max) => largest.max(nanos),
            });
        }
        Ok(match (total, unbounded) {
            (_, true) => AppValue::Unbounded,
            (Some(nanos), false) => AppValue::Nanos(nanos),
            (None, false) => AppValue::Nothing,
        })
    }

    /// The sized value and how it was reached, or why the template's own value stays (`Ok(Err)`).
    fn size(&self, app: AppValue) -> Result<Result<(i128, String), String>, String> {
        let of = format!(
            "{} of the app containers' {}.{}",
            match self.from {
                From::Sum => "the sum",
                From::Max => "the largest",
            },
            self.field.name(),
            self.resource
        );
        let (nanos, mut how) = match app {
            AppValue::Nothing => {
                let why = format!("no app container sets {}.{}", self.field.name(), self.resource);
                return Ok(match &self.min {
                    Some(min) => Ok((min.nanos, format!("min: {why}"))),
                    None => Err(why),
                });
            }
            AppValue::Unbounded => {
                let why = format!("an app container has no {}.{}", self.field.name(), self.resource);
                return Ok(match &self.max {
                    Some(max) => Ok((max.nanos, format!("max: {why}"))),
                    None => Err(format!("{why} and the rule no max")),
                });
            }
            AppValue::Nanos(nanos) => {
                let scaled = nanos.checked_mul(self.fraction).ok_or("the value times the fraction overflows")?;
                // Rounded up to the nano-unit, then up to a multiple of `round`.
                let scaled = div_ceil(scaled, NANO);
                let rounded = div_ceil(scaled, self.round.nanos)
                    .checked_mul(self.round.nanos)
                    .ok_or("the rounded value overflows")?;
                let text = quantity::format(nanos, &self.round.text);
                (rounded, format!("{of} {text} × {}, rounded up to {}", self.fraction_text, self.round.text))
            }
        };
        let mut nanos = nanos;
        if let Some(min) = self.min.as_ref().filter(|min| nanos < min.nanos) {
            nanos = min.nanos;
            how.push_str(&format!(", raised to min {}", min.text));
        }
        if let Some(max) = self.max.as_ref().filter(|max| nanos > max.nanos) {
            nanos = max.nanos;
            how.push_str(&format!(", lowered to max {}", max.text));
        }
        Ok(Ok((nanos, how)))
    }
}

/// `a / b` rounded up, for `a >= 0`, `b > 0`.
fn div_ceil(a: i128, b: i128) -> i128 {
    a / b + i128::from(a % b != 0)
}

fn resource_of<'c>(container: &'c Value, field: Field, resource: &str) -> Option<&'c Value> {
    container.get("resources")?.get(field.name())?.get(resource)
}

fn set_resource(container: &mut Value, field: Field, resource: &str, text: &str) {
    let Some(container) = container.as_object_mut() else { return };
    let resources = container.entry("resources").or_insert_with(|| Value::Object(Map::new()));
    if !resources.is_object() {
        *resources = Value::Object(Map::new());
    }
    let values =
        resources.as_object_mut().expect("an object").entry(field.name()).or_insert_with(|| Value::Object(Map::new()));
    if !values.is_object() {
        *values = Value::Object(Map::new());
    }
    values.as_object_mut().expect("an object").insert(resource.to_owned(), Value::String(text.to_owned()));
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn app(resources: &[Value]) -> Vec<Value> {
        resources.iter().enumerate().map(|(i, r)| json!({"name": format!("app-{i}"), "resources": r})).collect()
    }

    fn sized(sizing: Value, container: Value, app_resources: &[Value]) -> Result<(Value, Vec<String>), String> {
        let sizing = Sizing::parse(&sizing)?;
        let mut container = container;
        let notes = sizing.apply(&mut container, &app(app_resources))?;
        Ok((container["resources"].clone(), notes))
    }

    #[test]
    fn a_value_is_the_apps_sum_or_largest_times_the_fraction_rounded_up_and_bounded() {
        let agent = json!({"name": "agent", "image": "a"});
        let two_apps = [
            json!({"requests": {"cpu": "700m", "memory": "300Mi"}}),
            json!({"requests": {"cpu": 0.5, "memory": "1Gi"}}),
        ];
        // (rule, field.resource, the value written)
        let cases = [
            (json!({"from": "sum", "fraction": 0.1}), "requests.cpu", "120m"),
            (json!({"from": "max", "fraction": 0.1}), "requests.cpu", "70m"),
            (json!({"from": "sum", "fraction": "0.15"}), "requests.cpu", "180m"),
            // 1200m × 0.333 = 399.6m, rounded up to 10m.
            (json!({"from": "sum", "fraction": 0.333, "round": "10m"}), "requests.cpu", "400m"),
            (json!({"from": "sum", "fraction": 1, "round": "1"}), "requests.cpu", "2"),
            (json!({"from": "sum", "fraction": 0.01, "min": "50m"}), "requests.cpu", "50m"),
            (json!({"from": "sum", "fraction": 2, "max": 2}), "requests.cpu", "2"),
            // 1324Mi × 0.25 = 331Mi; rounded up to 64Mi: 384Mi.
            (json!({"from": "sum", "fraction": 0.25, "round": "64Mi"}), "requests.memory", "384Mi"),
            (json!({"from": "max", "fraction": 0.5, "round": "1Mi"}), "requests.memory", "512Mi"),
            (json!({"from": "max", "fraction": 1.5, "round": "1Mi"}), "requests.memory", "1536Mi"),
            // Bytes: 1Gi × 0.1 = 107374182.4, rounded up to a byte, written as Kubernetes writes it.
            (json!({"from": "max", "fraction": 0.1}), "requests.memory", "107374183"),
        ];
        for (rule, at, written) in cases {
            let (field, resource) = at.split_once('.').unwrap();
            let sizing = json!({ field: { resource: rule.clone() } });
            let (resources, notes) = sized(sizing, agent.clone(), &two_apps).unwrap();
            assert_eq!(resources[field][resource], written, "{rule} {at}: {notes:?}");
            assert_eq!(
                quantity::parse(written).map(|n| quantity::format(n, written)),
                Some(written.to_owned()),
                "written as stored"
            );
        }
        let (_, notes) = sized(
            json!({"requests": {"cpu": {"from": "sum", "fraction": 0.01, "min": "50m"}}}),
            agent.clone(),
            &two_apps,
        )
        .unwrap();
        assert_eq!(
            notes,
            [
                "container agent: requests.cpu = 50m (the sum of the app containers' requests.cpu 1200m × 0.01, rounded up to 1m, raised to min 50m)"
            ]
        );
    }

    #[test]
    fn requests_default_to_limits_and_a_missing_limit_is_unbounded() {
        let agent = json!({"name": "agent", "resources": {"requests": {"cpu": "5m"}, "limits": {"cpu": "20m"}}});
        let limited_only = [json!({"limits": {"cpu": "1"}}), json!({"requests": {"cpu": "1"}})];
        let rule = |field: &str, extra: Value| {
            let mut rule = json!({"from": "sum", "fraction": 0.1});
            rule.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            json!({ field: {"cpu": rule} })
        };
        // A request from the first app's limit; the request is held at the agent's limit 20m.
        let (resources, notes) = sized(rule("requests", json!({})), agent.clone(), &limited_only).unwrap();
        assert_eq!(resources["requests"]["cpu"], "20m", "{notes:?}");
        assert!(notes[0].ends_with("× 0.1, rounded up to 1m, held at the container's limit)"), "{notes:?}");
        // The second app has no limit: the sized limit is max, else the template's.
        let (resources, _) = sized(rule("limits", json!({"max": "500m"})), agent.clone(), &limited_only).unwrap();
        assert_eq!(resources["limits"]["cpu"], "500m");
        let (resources, notes) = sized(rule("limits", json!({})), agent.clone(), &limited_only).unwrap();
        assert_eq!(
            (resources["limits"]["cpu"].as_str(), notes[0].as_str()),
            (
                Some("20m"),
                "container agent: limits.cpu stays the template's: an app container has no limits.cpu and the rule no max"
            )
        );
        // Nothing to size from: min, else the template's own (here none).
        let bare = json!({"name": "agent"});
        let (resources, _) = sized(rule("requests", json!({"min": "10m"})), bare.clone(), &[json!({})]).unwrap();
        assert_eq!(resources["requests"]["cpu"], "10m");
        let (resources, _) = sized(rule("requests", json!({})), bare, &[json!({})]).unwrap();
        assert_eq!(resources, Value::Null);
        // Limits and requests sized together: the request is held at the sized limit.
        let both = json!({"limits": {"cpu": {"from": "sum", "fraction": 0.1}}, "requests": {"cpu": {"from": "sum", "fraction": 0.5}}});
        let (resources, _) =
            sized(both, json!({"name": "agent"}), &[json!({"requests": {"cpu": "1"}, "limits": {"cpu": "2"}})])
                .unwrap();
        assert_eq!(
            (resources["limits"]["cpu"].as_str(), resources["requests"]["cpu"].as_str()),
            (Some("200m"), Some("200m"))
        );
        // A sized limit below the request the template fixes: raised to it.
        let (resources, notes) = sized(rule("limits", json!({})), agent, &[json!({"limits": {"cpu": "20m"}})]).unwrap();
        assert_eq!(resources["limits"]["cpu"], "5m");
        assert!(notes[0].ends_with("rounded up to 1m, raised to the container's request)"), "{notes:?}");
    }

    #[test]
    fn a_rule_that_cannot_size_is_refused_in_the_authors_terms() {
        // (sizing, error)
        let cases = [
            (
                json!("small"),
                "sizing must be {requests: {<resource>: <rule>}, limits: {<resource>: <rule>}}, not a string",
            ),
            (json!({"request": {}}), "unknown key \"request\" in sizing (expected requests, limits)"),
            (json!({"requests": {}}), "sizing.requests must map resources to rules"),
            (
                json!({"requests": {"cpu": {"fraction": 1}}}),
                "sizing.requests.cpu: from must be sum or max, not missing",
            ),
            (json!({"requests": {"cpu": {"from": "avg", "fraction": 1}}}), "from must be sum or max, not \"avg\""),
            (json!({"requests": {"cpu": {"from": "sum"}}}), "fraction is missing"),
            (
                json!({"requests": {"cpu": {"from": "sum", "fraction": 0}}}),
                "fraction must be a positive decimal number like 0.25, not 0",
            ),
            (json!({"requests": {"cpu": {"from": "sum", "fraction": "10%"}}}), "not \"10%\""),
            (json!({"requests": {"cpu": {"from": "sum", "fraction": "1k"}}}), "not \"1k\""),
            (
                json!({"requests": {"cpu": {"from": "sum", "fraction": 1, "min": "1", "max": "500m"}}}),
                "min 1 is more than max 500m",
            ),
            (
                json!({"requests": {"cpu": {"from": "sum", "fraction": 1, "round": 0}}}),
                "round must be more than zero, not 0",
            ),
            (
                json!({"requests": {"cpu": {"from": "sum", "fraction": 1, "max": "12 Gi"}}}),
                "max must be a quantity, not \"12 Gi\"",
            ),
            (json!({"requests": {"cpu": {"from": "sum", "fraction": 1, "floor": "1"}}}), "unknown key \"floor\""),
        ];
        for (sizing, error) in cases {
            let got = Sizing::parse(&sizing).unwrap_err();
            assert!(got.contains(error), "{sizing}: {got}");
        }
    }

    #[test]
    fn a_negative_app_value_is_an_error() {
        let sizing = json!({"requests": {"cpu": {"from": "sum", "fraction": 0.5}}});
        let error = sized(sizing, json!({"name": "agent"}), &[json!({"requests": {"cpu": "-1"}})]).unwrap_err();
        assert_eq!(
            error,
            "container agent: requests.cpu: app container app-0 has requests.cpu \"-1\", which is negative"
        );
    }

    #[test]
    fn a_sized_limit_is_raised_to_the_request_the_template_keeps() {
        // The request rule has nothing to size from and keeps the template's 500m: the limit,
        // lowered to its max, must not fall below it.
        let sizing = json!({
            "limits": {"cpu": {"from": "sum", "fraction": 1, "max": "200m"}},
            "requests": {"cpu": {"from": "sum", "fraction": 0.5}},
        });
        let container = json!({"name": "agent", "resources": {"requests": {"cpu": "500m"}}});
        let (resources, notes) = sized(sizing, container, &[json!({})]).unwrap();
        assert_eq!(resources, json!({"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}), "{notes:?}");
    }

    #[test]
    fn overflow_and_an_app_value_that_is_no_quantity_are_errors_naming_the_container() {
        let huge = json!({"requests": {"memory": "8Ei"}});
        let sizing = json!({"requests": {"memory": {"from": "sum", "fraction": 100000000}}});
        let error = sized(sizing, json!({"name": "agent"}), &[huge.clone(), huge]).unwrap_err();
        assert_eq!(error, "container agent: requests.memory: the value times the fraction overflows");
        let sizing = json!({"requests": {"cpu": {"from": "sum", "fraction": 1}}});
        let error = sized(sizing, json!({"name": "agent"}), &[json!({"requests": {"cpu": "lots"}})]).unwrap_err();
        assert_eq!(
            error,
            "container agent: requests.cpu: app container app-0 has requests.cpu \"lots\", which is no quantity"
        );
    }
}
