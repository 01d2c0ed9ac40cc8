use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

use crate::domain::ParseError;

/// What an operator may do. Each role includes everything the roles before
/// it may do: a viewer reads, an operator also acts on keys and findings, an
/// approver also decides cap increases, an admin also manages operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Operator,
    Approver,
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Operator, Role::Approver, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Approver => "approver",
            Role::Admin => "admin",
        }
    }

    /// Whether someone with this role may do what `needed` guards.
    pub fn allows(self, needed: Role) -> bool {
        self >= needed
    }

    pub fn describe(self) -> &'static str {
        match self {
            Role::Viewer => "reads everything, changes nothing",
            Role::Operator => "creates and revokes keys, resolves findings",
            Role::Approver => "also approves cap increases",
            Role::Admin => "also manages operators",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|role| role.as_str() == s.trim())
            .ok_or_else(|| {
                ParseError::new(format!(
                    "unknown role {s:?}: choose viewer, operator, approver or admin"
                ))
            })
    }
}

impl TryFrom<String> for Role {
    type Error = ParseError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_allows_the_roles_below_it_and_not_above() {
        assert!(Role::Admin.allows(Role::Approver));
        assert!(Role::Approver.allows(Role::Operator));
        assert!(Role::Operator.allows(Role::Viewer));
        assert!(!Role::Operator.allows(Role::Approver));
        assert!(!Role::Viewer.allows(Role::Operator));
    }

    #[test]
    fn roles_round_trip_through_their_names_and_unknown_names_are_refused() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
        }
        let err = "superuser".parse::<Role>().unwrap_err();
        assert!(err.0.contains("superuser"), "{err}");
    }
}
