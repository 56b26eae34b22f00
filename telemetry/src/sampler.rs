//! Head sampling, configured by the standard `OTEL_TRACES_SAMPLER` and
//! `OTEL_TRACES_SAMPLER_ARG` variables.
//!
//! The decision is made once per span start from the parent's `sampled` flag
//! and the trace id, and travels downstream in the `sampled` flag, so every
//! service of a trace agrees without talking to each other.
//!
//! Default (variable unset): `parentbased_traceidratio` with ratio
//! [`DEFAULT_RATIO`] (0.1): a request that arrives with a `traceparent`
//! follows the caller's decision; a trace started at the edge is recorded
//! with probability 0.1. `OTEL_TRACES_SAMPLER_ARG` alone changes that ratio.

use crate::error::TelemetryError;
use crate::traceparent::TraceContext;

/// Ratio used for traces started here when no sampler is configured.
pub const DEFAULT_RATIO: f64 = 0.1;

/// What to do for spans without a parent (or for every span when not parent-based).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Root {
    AlwaysOn,
    AlwaysOff,
    /// Sample when the trace id's low 63 bits fall below this bound
    /// (the same rule as the OpenTelemetry SDKs' `TraceIdRatioBased`, so
    /// services in other languages agree for the same trace id).
    Ratio {
        ratio: f64,
        bound: u64,
    },
}

/// A head sampler: `always_on`, `always_off`, `traceidratio`, optionally parent-based.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    parent_based: bool,
    root: Root,
}

impl Default for Sampler {
    /// `parentbased_traceidratio` with [`DEFAULT_RATIO`].
    fn default() -> Self {
        Self::parent_based_ratio(DEFAULT_RATIO)
    }
}

impl Sampler {
    /// Records every span.
    pub fn always_on() -> Self {
        Self {
            parent_based: false,
            root: Root::AlwaysOn,
        }
    }

    /// Records no span (ids are still generated and propagated).
    pub fn always_off() -> Self {
        Self {
            parent_based: false,
            root: Root::AlwaysOff,
        }
    }

    /// Follows the parent's decision; traces started here are sampled by `ratio` (clamped to 0..=1).
    pub fn parent_based_ratio(ratio: f64) -> Self {
        Self {
            parent_based: true,
            root: ratio_root(ratio),
        }
    }

    /// Parses the standard variables' values. `sampler` is `OTEL_TRACES_SAMPLER`
    /// (`None` or empty: the default), `arg` is `OTEL_TRACES_SAMPLER_ARG`.
    pub fn from_values(sampler: Option<&str>, arg: Option<&str>) -> Result<Self, TelemetryError> {
        let ratio = |default: f64| -> Result<f64, TelemetryError> {
            match arg.map(str::trim).filter(|a| !a.is_empty()) {
                None => Ok(default),
                Some(a) => a
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| {
                        TelemetryError::Config(format!(
                            "OTEL_TRACES_SAMPLER_ARG={a:?} is not a ratio between 0 and 1"
                        ))
                    }),
            }
        };
        let name = sampler.map(str::trim).filter(|s| !s.is_empty());
        let (parent_based, root) = match name {
            None => (true, ratio_root(ratio(DEFAULT_RATIO)?)),
            Some("always_on") => (false, Root::AlwaysOn),
            Some("always_off") => (false, Root::AlwaysOff),
            Some("traceidratio") => (false, ratio_root(ratio(1.0)?)),
            Some("parentbased_always_on") => (true, Root::AlwaysOn),
            Some("parentbased_always_off") => (true, Root::AlwaysOff),
            Some("parentbased_traceidratio") => (true, ratio_root(ratio(1.0)?)),
            Some(other) => {
                return Err(TelemetryError::Config(format!(
                    "OTEL_TRACES_SAMPLER={other:?} is not supported; use always_on, always_off, \
                     traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio"
                )));
            }
        };
        Ok(Self { parent_based, root })
    }

    /// Reads `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`.
    pub fn from_env() -> Result<Self, TelemetryError> {
        let sampler = std::env::var("OTEL_TRACES_SAMPLER").ok();
        let arg = std::env::var("OTEL_TRACES_SAMPLER_ARG").ok();
        Self::from_values(sampler.as_deref(), arg.as_deref())
    }

    /// Whether a span with this trace id and (remote or local) parent is recorded.
    #[inline]
    pub fn should_sample(&self, parent: Option<&TraceContext>, trace_id: &[u8; 16]) -> bool {
        match parent {
            Some(parent) if self.parent_based => parent.is_sampled(),
            _ => match self.root {
                Root::AlwaysOn => true,
                Root::AlwaysOff => false,
                Root::Ratio { bound, .. } => {
                    let mut low = [0u8; 8];
                    low.copy_from_slice(&trace_id[8..]);
                    (u64::from_be_bytes(low) >> 1) < bound
                }
            },
        }
    }

    /// A short description for a startup log line, e.g. `parentbased_traceidratio(0.1)`.
    pub fn describe(&self) -> String {
        let prefix = if self.parent_based {
            "parentbased_"
        } else {
            ""
        };
        match self.root {
            Root::AlwaysOn => format!("{prefix}always_on"),
            Root::AlwaysOff => format!("{prefix}always_off"),
            Root::Ratio { ratio, .. } => format!("{prefix}traceidratio({ratio})"),
        }
    }
}

fn ratio_root(ratio: f64) -> Root {
    let ratio = if ratio.is_nan() {
        0.0
    } else {
        ratio.clamp(0.0, 1.0)
    };
    if ratio >= 1.0 {
        return Root::AlwaysOn;
    }
    // Same arithmetic as opentelemetry_sdk's TraceIdRatioBased.
    let bound = (ratio * (1u64 << 63) as f64) as u64;
    Root::Ratio { ratio, bound }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent(sampled: bool) -> TraceContext {
        TraceContext::new_root(sampled)
    }

    #[test]
    fn default_is_parent_based_ratio() {
        let s = Sampler::from_values(None, None).unwrap();
        assert_eq!(s, Sampler::default());
        assert_eq!(s.describe(), "parentbased_traceidratio(0.1)");
        assert!(s.should_sample(Some(&parent(true)), &[0xff; 16]));
        assert!(!s.should_sample(Some(&parent(false)), &[0; 16]));
        // Edge-started: low bits decide.
        assert!(s.should_sample(None, &[0; 16]));
        assert!(!s.should_sample(None, &[0xff; 16]));
        // The ratio is roughly honoured over random ids.
        let sampled = (0..20_000)
            .filter(|_| s.should_sample(None, &TraceContext::new_root(false).trace_id))
            .count();
        assert!((1500..2500).contains(&sampled), "{sampled} of 20000");
        // The arg alone changes the default's ratio.
        let s = Sampler::from_values(Some(""), Some("1")).unwrap();
        assert_eq!(s.describe(), "parentbased_always_on");
    }

    #[test]
    fn named_samplers() {
        let on = Sampler::from_values(Some("always_on"), None).unwrap();
        assert!(on.should_sample(Some(&parent(false)), &[0xff; 16]));
        let off = Sampler::from_values(Some("always_off"), Some("0.5")).unwrap();
        assert!(!off.should_sample(Some(&parent(true)), &[0; 16]));
        let pb_on = Sampler::from_values(Some("parentbased_always_on"), None).unwrap();
        assert!(pb_on.should_sample(None, &[0xff; 16]));
        assert!(!pb_on.should_sample(Some(&parent(false)), &[0xff; 16]));
        let pb_off = Sampler::from_values(Some("parentbased_always_off"), None).unwrap();
        assert!(!pb_off.should_sample(None, &[0; 16]));
        assert!(pb_off.should_sample(Some(&parent(true)), &[0; 16]));
        let ratio = Sampler::from_values(Some("traceidratio"), Some("0")).unwrap();
        assert!(!ratio.should_sample(Some(&parent(true)), &[0; 16]));
        let full = Sampler::from_values(Some("traceidratio"), None).unwrap();
        assert!(full.should_sample(None, &[0xff; 16]));
        let pb_ratio =
            Sampler::from_values(Some("parentbased_traceidratio"), Some("0.25")).unwrap();
        assert_eq!(pb_ratio.describe(), "parentbased_traceidratio(0.25)");
    }

    #[test]
    fn bad_values_are_clear_errors() {
        let err = Sampler::from_values(Some("jaeger_remote"), None).unwrap_err();
        assert!(
            err.to_string()
                .contains("OTEL_TRACES_SAMPLER=\"jaeger_remote\""),
            "{err}"
        );
        for arg in ["1.5", "-0.1", "half", "NaN"] {
            let err = Sampler::from_values(Some("traceidratio"), Some(arg)).unwrap_err();
            assert!(err.to_string().contains("OTEL_TRACES_SAMPLER_ARG"), "{err}");
        }
    }
}
