//! Ports that collide inside a pod. Containers that run at the same time share the pod's network:
//! two that declare the same port number and protocol cannot both bind it (the second fails, and
//! a sidecar crash-loops), and two that declare the same port name make a Service's `targetPort`
//! by that name ambiguous. The API server refuses neither (e2e scenario 31), so the injection warns
//! when a container it adds collides with another (`plan`), and `check-templates` when a
//! template's own sidecars collide (`load`). Under `hostNetwork` every port is also a host port
//! (the API server defaults `hostPort` to `containerPort`, after the webhook's patch too) and the
//! API server refuses two of the same number: such a collision is a reason not to inject, and every
//! port an injected container takes on the node is a warning. A leaf: it reads containers as JSON.

use serde_json::Value;

/// A container that runs beside the others (an app container, a classic or native sidecar).
#[derive(Debug, Clone, Copy)]
pub struct Running<'a> {
    /// The container.
    pub container: &'a Value,
    /// Whether the injection adds it (collisions between the pod's own containers are the
    /// author's).
    pub injected: bool,
}

/// One declared port.
#[derive(Clone, Copy)]
struct Port<'a> {
    number: i64,
    protocol: &'a str,
    name: Option<&'a str>,
}

fn ports(container: &Value) -> impl Iterator<Item = Port<'_>> {
    let declared = container.get("ports").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    declared.iter().filter_map(|port| {
        Some(Port {
            number: port.get("containerPort")?.as_i64()?,
            protocol: port.get("protocol").and_then(Value::as_str).unwrap_or("TCP"),
            name: port.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()),
        })
    })
}

fn described(running: &Running<'_>) -> String {
    let name = running.container.get("name").and_then(Value::as_str).unwrap_or_default();
    match running.injected {
        true => format!("injected container {name}"),
        false => format!("container {name}"),
    }
}

/// The collisions that involve an injected container, one sentence each naming both containers and
/// the port.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Collisions {
    /// What the API server refuses: the same port number twice under `hostNetwork`.
    pub refused: Vec<String>,
    /// What it admits: the same number (without `hostNetwork`) or the same name, and under
    /// `hostNetwork` every port an injected container takes on the node.
    pub warned: Vec<String>,
}

/// The collisions of `running`, in a pod that uses the node's network or not.
pub fn collisions(running: &[Running<'_>], host_network: bool) -> Collisions {
    let mut found = Collisions::default();
    for injected in running.iter().filter(|r| r.injected && host_network) {
        for port in ports(injected.container) {
            found.warned.push(format!(
                "{} takes port {}/{} of the node (hostNetwork): it fails to start where another process or hostNetwork pod holds it",
                described(injected),
                port.number,
                port.protocol
            ));
        }
    }
    for (index, later) in running.iter().enumerate() {
        for earlier in running[..index].iter().filter(|earlier| earlier.injected || later.injected) {
            for (a, b) in ports(earlier.container).flat_map(|a| ports(later.container).map(move |b| (a, b))) {
                if a.number == b.number && a.protocol == b.protocol {
                    let (earlier, later, number, protocol) =
                        (described(earlier), described(later), a.number, a.protocol);
                    match host_network {
                        true => found.refused.push(format!(
                            "spec.hostNetwork: {earlier} and {later} both declare port {number}/{protocol}, a host port of the node twice (Duplicate value)"
                        )),
                        false => found.warned.push(format!(
                            "{earlier} and {later} both declare port {number}/{protocol}: only the first to bind it runs, the other fails"
                        )),
                    }
                }
                if let (Some(name), true) = (a.name, a.name == b.name) {
                    found.warned.push(format!(
                        "{} and {} both name a port {name:?} ({} and {}): a Service's targetPort {name} is ambiguous",
                        described(earlier),
                        described(later),
                        a.number,
                        b.number
                    ));
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn collisions_name_both_containers_and_the_port() {
        // The corpus issue's app container, and a sidecar declaring the same numbers and names.
        let app = json!({"name": "app", "ports": [
            {"name": "proxy-inbound", "containerPort": 15006}, {"name": "proxy-admin", "containerPort": 9901},
            {"name": "otlp-grpc", "containerPort": 9090}, {"name": "mesh-out", "containerPort": 8080}]});
        let proxy = json!({"name": "proxy", "ports": [
            {"name": "proxy-admin", "containerPort": 9901}, {"name": "metrics", "containerPort": 8080},
            {"name": "dns", "containerPort": 8080, "protocol": "UDP"}, {"containerPort": 15006}]});
        let other = json!({"name": "other", "ports": [{"name": "metrics", "containerPort": 9100}]});
        let running = [
            Running { container: &app, injected: false },
            Running { container: &proxy, injected: true },
            Running { container: &other, injected: false },
        ];
        let found = collisions(&running, false);
        assert_eq!(found.refused, Vec::<String>::new());
        assert_eq!(
            found.warned,
            [
                "container app and injected container proxy both declare port 15006/TCP: only the first to bind it runs, the other fails",
                "container app and injected container proxy both declare port 9901/TCP: only the first to bind it runs, the other fails",
                "container app and injected container proxy both name a port \"proxy-admin\" (9901 and 9901): a Service's targetPort proxy-admin is ambiguous",
                "container app and injected container proxy both declare port 8080/TCP: only the first to bind it runs, the other fails",
                "injected container proxy and container other both name a port \"metrics\" (8080 and 9100): a Service's targetPort metrics is ambiguous",
            ]
        );
        // The pod's own containers colliding among themselves are the author's.
        let own = [Running { container: &app, injected: false }, Running { container: &app, injected: false }];
        assert_eq!(collisions(&own, true), Collisions::default());
        // No ports, or ports of other numbers, protocols and names: nothing.
        let quiet = json!({"name": "quiet", "ports": [{"containerPort": 8080, "protocol": "SCTP"}]});
        let plain = json!({"name": "plain"});
        let running = [Running { container: &app, injected: false }, Running { container: &quiet, injected: true }];
        assert_eq!(collisions(&running, false), Collisions::default());
        assert_eq!(collisions(&[Running { container: &plain, injected: true }], true), Collisions::default());
        // Under hostNetwork the same number is a host port twice, which the API server refuses.
        let running = [Running { container: &app, injected: false }, Running { container: &proxy, injected: true }];
        let found = collisions(&running, true);
        assert_eq!(
            found.refused,
            [
                "spec.hostNetwork: container app and injected container proxy both declare port 15006/TCP, a host port of the node twice (Duplicate value)",
                "spec.hostNetwork: container app and injected container proxy both declare port 9901/TCP, a host port of the node twice (Duplicate value)",
                "spec.hostNetwork: container app and injected container proxy both declare port 8080/TCP, a host port of the node twice (Duplicate value)",
            ]
        );
        assert_eq!(found.warned.len(), 5, "4 ports of the node, the shared name proxy-admin: {:?}", found.warned);
        assert_eq!(
            found.warned[0],
            "injected container proxy takes port 9901/TCP of the node (hostNetwork): it fails to start where another process or hostNetwork pod holds it"
        );
    }
}
