use serde::{Deserialize, Serialize};

/// How far the read replica trails the primary, in whole seconds (at
/// least one): what a page read from it may be missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaLag {
    pub seconds: i64,
}

impl ReplicaLag {
    pub fn of(behind: chrono::Duration) -> Self {
        let millis = behind.num_milliseconds().max(1);
        Self {
            seconds: (millis + 999) / 1000,
        }
    }

    /// "3 s", "4 min 10 s", "2 h 5 min": as a person reads it.
    pub fn text(&self) -> String {
        let (h, m, s) = (
            self.seconds / 3600,
            self.seconds / 60 % 60,
            self.seconds % 60,
        );
        match (h, m) {
            (0, 0) => format!("{s} s"),
            (0, _) => format!("{m} min {s} s"),
            _ => format!("{h} h {m} min"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReplicaLag;

    #[test]
    fn a_lag_reads_in_the_largest_units_that_matter_and_never_as_zero() {
        let lag = |ms| ReplicaLag::of(chrono::Duration::milliseconds(ms)).text();
        assert_eq!(lag(0), "1 s");
        assert_eq!(lag(1_200), "2 s");
        assert_eq!(lag(250_000), "4 min 10 s");
        assert_eq!(lag(7_500_000), "2 h 5 min");
    }
}
