//! What a decision tells its user besides its outcome: typed warnings, each with a stable code.
//!
//! Admission warnings, `inject`'s and `explain`'s output print the message; the Events and the
//! `decision_warnings_total` metric read the code, never the wording, so a reworded message cannot
//! silently stop an Event or a count.

use std::fmt;

/// Why a decision warns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WarningCode {
    /// An override or choice annotation the template does not allow was ignored.
    OverrideIgnored,
    /// An `enforced: audit` template reports what `enforced: true` would do to this pod.
    EnforcementAudit,
    /// The pod's status annotation could not be read, so it is replaced.
    StatusUnreadable,
    /// Items the status annotation claims are not treated as the injector's own (see `ownership`).
    ClaimDoubted,
    /// A template asks for native sidecars where the kubelet cannot run them: they are classic.
    NativeSidecarsUnavailable,
    /// Classic sidecars in a Job's pod: the Job does not complete while they run.
    ClassicSidecarsInJob,
    /// A merged env var adds to a value only an `envFrom` source may hold.
    MergeSourceUncertain,
    /// The injection would make a pod the API server refuses, so the pod is admitted without it.
    InjectionWouldBeInvalid,
    /// A template was left out: the namespace's Pod Security `enforce` level would refuse the pod
    /// with what it adds.
    PodSecurityLeftOut,
    /// The injection makes the pod fail the namespace's Pod Security `warn` or `audit` level.
    PodSecurityWarn,
    /// An injected container declares a port number or name another container of the pod has.
    PortCollision,
    /// An image volume was injected as its declared fallback: the nodes the pod can run on cannot
    /// mount it (or apply its `subPath`).
    ImageVolumeFallback,
    /// An image volume without a fallback was injected where the nodes the pod can run on cannot
    /// mount it (or apply its `subPath`).
    ImageVolumeUnsupported,
    /// An injected container needs a feature that no node the pod can run on declares (or, for
    /// a node that declares none, enables by its kubelet version): the pod is not scheduled.
    NodeFeatureMissing,
}

impl WarningCode {
    /// Every code, for documentation and metrics that start at zero.
    pub const ALL: [WarningCode; 14] = [
        WarningCode::OverrideIgnored,
        WarningCode::EnforcementAudit,
        WarningCode::StatusUnreadable,
        WarningCode::ClaimDoubted,
        WarningCode::NativeSidecarsUnavailable,
        WarningCode::ClassicSidecarsInJob,
        WarningCode::MergeSourceUncertain,
        WarningCode::InjectionWouldBeInvalid,
        WarningCode::PodSecurityLeftOut,
        WarningCode::PodSecurityWarn,
        WarningCode::PortCollision,
        WarningCode::ImageVolumeFallback,
        WarningCode::ImageVolumeUnsupported,
        WarningCode::NodeFeatureMissing,
    ];

    /// The stable code (a metric label value, and what docs/troubleshooting.md lists).
    pub fn as_str(self) -> &'static str {
        match self {
            WarningCode::OverrideIgnored => "override_ignored",
            WarningCode::EnforcementAudit => "enforcement_audit",
            WarningCode::StatusUnreadable => "status_unreadable",
            WarningCode::ClaimDoubted => "claim_doubted",
            WarningCode::NativeSidecarsUnavailable => "native_sidecars_unavailable",
            WarningCode::ClassicSidecarsInJob => "classic_sidecars_in_job",
            WarningCode::MergeSourceUncertain => "merge_source_uncertain",
            WarningCode::InjectionWouldBeInvalid => "injection_would_be_invalid",
            WarningCode::PodSecurityLeftOut => "pod_security_left_out",
            WarningCode::PodSecurityWarn => "pod_security_warn",
            WarningCode::PortCollision => "port_collision",
            WarningCode::ImageVolumeFallback => "image_volume_fallback",
            WarningCode::ImageVolumeUnsupported => "image_volume_unsupported",
            WarningCode::NodeFeatureMissing => "node_feature_missing",
        }
    }

    /// The reason of the Warning Event posted on the pod's owner for warnings of this code, if
    /// they get one (the ones the pod's author must act on).
    pub fn event_reason(self) -> Option<&'static str> {
        match self {
            WarningCode::OverrideIgnored => Some("OverridesIgnored"),
            WarningCode::EnforcementAudit => Some("EnforcementAudit"),
            WarningCode::PodSecurityLeftOut => Some("InjectionLeftOutByPodSecurity"),
            _ => None,
        }
    }
}

/// One warning of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// Why.
    pub code: WarningCode,
    /// What to tell the user, as a sentence.
    pub message: String,
}

impl Warning {
    /// A warning of `code` saying `message`.
    pub fn new(code: WarningCode, message: impl Into<String>) -> Self {
        Warning { code, message: message.into() }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_snake_case_and_complete() {
        let codes: std::collections::BTreeSet<&str> = WarningCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(codes.len(), WarningCode::ALL.len());
        assert!(codes.iter().all(|c| c.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
    }
}
