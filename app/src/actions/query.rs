//! The operator action log's filters and position, as the URL carries them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{
    audit::query::{paging, text, time_range},
    domain::{Cursor, ParseError},
};

/// Where an action came from.
pub const ACTION_SOURCES: [&str; 4] = ["console", "api", "cli", "system"];

/// The query string as typed; [`ActionQuery::parse`] reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionQuery {
    pub from: Option<String>,
    pub to: Option<String>,
    /// The operator's email.
    pub operator: Option<String>,
    /// `create_vault_key`, `revoke_vault_key`, `export_audit_csv`, …
    pub action: Option<String>,
    /// `console`, `api`, `cli` or `system`.
    pub via: Option<String>,
    pub limit: Option<String>,
    pub after: Option<String>,
    pub before: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionFilter {
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub operator: Option<String>,
    pub action: Option<String>,
    pub via: Option<&'static str>,
    pub limit: i64,
    pub cursor: Option<Cursor>,
}

impl ActionQuery {
    pub fn parse(&self) -> Result<ActionFilter, ParseError> {
        let (from, to) = time_range(&self.from, &self.to)?;
        let (limit, cursor) = paging(&self.limit, &self.after, &self.before)?;
        let via =
            match text("source", &self.via)? {
                None => None,
                Some(raw) => Some(ACTION_SOURCES.into_iter().find(|s| *s == raw).ok_or_else(
                    || {
                        ParseError::new(format!(
                            "{raw:?} is not a source: use console, api, cli or system"
                        ))
                    },
                )?),
            };
        let action = text("action", &self.action)?;
        if let Some(action) = &action {
            if !action
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_' || b == b'.')
            {
                return Err(ParseError::new(format!(
                    "{action:?} is not an action name (lower case, underscores and dots, like revoke_vault_key or alert.acknowledge)"
                )));
            }
        }
        Ok(ActionFilter {
            from,
            to,
            operator: text("operator", &self.operator)?.map(|e| e.to_lowercase()),
            action,
            via,
            limit,
            cursor,
        })
    }

    /// The same filters at another position (`None`: the first page).
    pub fn at(&self, cursor: Option<Cursor>) -> ActionQuery {
        let (after, before) = match cursor {
            None => (None, None),
            Some(Cursor::After(p)) => (Some(p.encode()), None),
            Some(Cursor::Before(p)) => (None, Some(p.encode())),
        };
        ActionQuery {
            after,
            before,
            ..self.clone()
        }
    }

    /// `/actions?…` with only the parameters that are set.
    pub fn href(&self) -> String {
        let pairs: Vec<String> = [
            ("from", &self.from),
            ("to", &self.to),
            ("operator", &self.operator),
            ("action", &self.action),
            ("via", &self.via),
            ("limit", &self.limit),
            ("after", &self.after),
            ("before", &self.before),
        ]
        .into_iter()
        .filter_map(|(name, value)| {
            let value = value.as_deref().filter(|v| !v.trim().is_empty())?;
            Some(format!("{name}={}", crate::keys::list::encode(value)))
        })
        .collect();
        if pairs.is_empty() {
            "/actions".into()
        } else {
            format!("/actions?{}", pairs.join("&"))
        }
    }
}

/// One recorded action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(sqlx::FromRow))]
pub struct ActionEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// The operator's email, the API token's name, or the command line /
    /// Vaultcap itself.
    pub who: String,
    pub via: String,
    pub ip: Option<String>,
    /// As recorded; `action_phrase` words it.
    pub action: String,
    /// What it touched: `vault_key` and its id, `billing_period` and the period.
    pub subject_type: String,
    pub subject_id: Option<String>,
    /// The currency of amounts in the details: the entry's own, or its
    /// vault key's.
    pub currency: Option<String>,
    /// The details' names and values (as text), side by side.
    pub detail_names: Vec<String>,
    pub detail_values: Vec<String>,
}

/// One page of the action log and the links around it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionPage {
    pub actions: Vec<ActionEntry>,
    pub newer: Option<ActionQuery>,
    pub older: Option<ActionQuery>,
    /// Action names recorded so far, for the filter.
    pub known_actions: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_action_filters_are_named() {
        let bad = |q: ActionQuery| q.parse().unwrap_err().0;
        assert!(bad(ActionQuery {
            via: Some("email".into()),
            ..Default::default()
        })
        .contains("\"email\" is not a source"));
        assert!(bad(ActionQuery {
            action: Some("x'; --".into()),
            ..Default::default()
        })
        .contains("is not an action name"));
        assert!(bad(ActionQuery {
            limit: Some("0".into()),
            ..Default::default()
        })
        .contains("is not a page size"));
        let ok = ActionQuery {
            operator: Some("Ops@Example.com".into()),
            ..Default::default()
        }
        .parse()
        .unwrap();
        assert_eq!(ok.operator.as_deref(), Some("ops@example.com"));
    }
}
