//! The API server's rules that an injection's additions can break, as the API server words them:
//! the total size of a pod's annotations, label keys and values, and the names and addresses that
//! identify the items added. `plan` checks what it adds against them before answering, so a pod
//! the injection would push over is left as its author wrote it (`Injection::invalid`) instead of
//! being refused by the API server for our patch; the item kinds (`kinds`) say which rule their
//! identities follow. A leaf: the rules read strings, nothing of the engine.

/// The API server's limit on the total size of an object's annotations: keys and values, in bytes.
pub const TOTAL_ANNOTATION_SIZE: usize = 256 * 1024;

/// The longest DNS label (RFC 1123), label value or name part of a qualified name.
const LABEL_LENGTH: usize = 63;

/// The longest DNS subdomain (RFC 1123), as a qualified name's prefix.
const SUBDOMAIN_LENGTH: usize = 253;

/// Whether `name` is a lowercase RFC 1123 label (container, volume and port names).
pub fn is_dns_label(name: &str) -> bool {
    dns_label_problem(name).is_none()
}

/// What keeps `name` from being a lowercase RFC 1123 label, as the API server says it.
pub fn dns_label_problem(name: &str) -> Option<String> {
    if name.len() > LABEL_LENGTH {
        return Some(format!("must be no more than {LABEL_LENGTH} characters"));
    }
    let alphanumeric = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = name.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.iter().all(|&b| alphanumeric(b) || b == b'-')
        && alphanumeric(bytes[0])
        && alphanumeric(bytes[bytes.len() - 1]);
    (!valid).then(|| {
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character".to_owned()
    })
}

/// What keeps `address` from being an IP address (a host alias's `ip`).
pub fn ip_problem(address: &str) -> Option<String> {
    address.parse::<std::net::IpAddr>().is_err().then(|| "must be a valid IP address".to_owned())
}

/// Any identity will do (an image pull secret's name).
pub fn no_problem(_: &str) -> Option<String> {
    None
}

/// Letters, digits, `-`, `_` and `.`, starting and ending with a letter or digit.
fn is_label_text(text: &str) -> bool {
    let bytes = text.as_bytes();
    let ends = |b: u8| b.is_ascii_alphanumeric();
    !bytes.is_empty()
        && bytes.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && ends(bytes[0])
        && ends(bytes[bytes.len() - 1])
}

/// What keeps `value` from being a label value, as the API server says it.
pub fn label_value_problem(value: &str) -> Option<String> {
    if value.len() > LABEL_LENGTH {
        return Some(format!("must be no more than {LABEL_LENGTH} characters"));
    }
    (!value.is_empty() && !is_label_text(value)).then(|| {
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".to_owned()
    })
}

/// What keeps `key` from being a qualified name (a label's or annotation's key: an optional DNS
/// subdomain prefix and `/`, then a name of at most 63 characters).
pub fn qualified_name_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let labels_valid = prefix.split('.').all(|label| dns_label_problem(label).is_none());
        if prefix.is_empty() || prefix.len() > SUBDOMAIN_LENGTH || !labels_valid {
            return Some("a qualified name's prefix must be a lowercase RFC 1123 subdomain".to_owned());
        }
    }
    if name.len() > LABEL_LENGTH {
        return Some(format!("name part must be no more than {LABEL_LENGTH} characters"));
    }
    (!is_label_text(name)).then(|| {
        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".to_owned()
    })
}

/// The size an annotation (or label) counts for in [`TOTAL_ANNOTATION_SIZE`].
pub fn entry_size((key, value): (&String, &String)) -> usize {
    key.len() + value.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses_follow_the_api_servers_rules() {
        for good in ["log-shipper", "a", "x1", &"a".repeat(63)] {
            assert_eq!(dns_label_problem(good), None, "{good}");
        }
        assert!(dns_label_problem(&"a".repeat(64)).unwrap().contains("no more than 63"));
        for bad in ["", "-a", "a-", "Log", "a_b", "a.b"] {
            assert!(dns_label_problem(bad).unwrap().contains("RFC 1123 label"), "{bad:?}");
        }
        assert_eq!(ip_problem("10.1.2.3"), None);
        assert_eq!(ip_problem("fd00::1"), None);
        assert!(ip_problem("10.1.2").is_some() && ip_problem("db.internal").is_some());
    }

    #[test]
    fn labels_and_keys_follow_the_api_servers_rules() {
        for good in ["", "v1", "a.b_c-d", &"a".repeat(63)] {
            assert_eq!(label_value_problem(good), None, "{good}");
        }
        assert!(label_value_problem(&"a".repeat(64)).unwrap().contains("no more than 63"));
        for bad in ["-a", "a.", "a b", "é"] {
            assert!(label_value_problem(bad).unwrap().contains("alphanumeric"), "{bad:?}");
        }
        for good in ["app", "sidecar-injector.io/status", "example.com/Some_Key.1"] {
            assert_eq!(qualified_name_problem(good), None, "{good}");
        }
        assert!(qualified_name_problem("/app").unwrap().contains("prefix"));
        assert!(qualified_name_problem("Example.com/app").unwrap().contains("prefix"));
        assert!(qualified_name_problem(&format!("x/{}", "a".repeat(64))).unwrap().contains("no more than 63"));
        assert!(qualified_name_problem("x/").unwrap().contains("name part"));
        assert!(qualified_name_problem("a b").unwrap().contains("name part"));
    }
}
