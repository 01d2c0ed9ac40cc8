//! Step 1, who is calling: the vault key presented as Stripe SDKs present
//! a key (once), known, not revoked, not expired.

use std::sync::Arc;

use axum::http::{header, HeaderMap};
use base64::Engine;
use chrono::{DateTime, Utc};

use app::{
    audit::sql::AuditEntry,
    domain::{moves_money, Decision},
    ssr::secrets,
};

use super::{
    call::{Refusal, Request},
    keys::ProxyKey,
    stripe_error::StripeError,
    ProxyState,
};

/// The key the call presents, as usable now. Names it in the audit row as
/// soon as it is known, so a refusal says whose call it was.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn authenticate(
    state: &ProxyState,
    request: &Request,
    entry: &mut AuditEntry,
) -> Result<Arc<ProxyKey>, Refusal> {
    let presented = presented_key(&request.headers)?;
    entry.key_prefix = Some(secrets::prefix(&presented));
    let hash = secrets::hash(&presented);
    let looked_up = if moves_money(request.method.as_str(), request.uri.path()) {
        state.keys.for_charge(&state.pool, &hash).await?
    } else {
        state.keys.current(&state.pool, &hash).await?
    };
    let key = looked_up.ok_or_else(unknown_key)?;
    entry.vault_key_id = Some(key.row.id);
    entry.billing_period = Some(key.row.billing_period);
    usable(&key, Utc::now())?;
    Ok(key)
}

/// A key revoked, or expired by `now`, is refused.
pub fn usable(key: &ProxyKey, now: DateTime<Utc>) -> Result<(), Refusal> {
    if key.row.revoked_at.is_some() {
        return Err(revoked(key));
    }
    if key.row.expires_at <= now {
        return Err(Refusal::Refused(
            Decision::RefusedExpired,
            StripeError::expired(&key.row),
        ));
    }
    Ok(())
}

pub fn revoked(key: &ProxyKey) -> Refusal {
    Refusal::Refused(Decision::RefusedRevoked, StripeError::revoked(&key.row))
}

fn unknown_key() -> Refusal {
    Refusal::Refused(Decision::RefusedUnknownKey, StripeError::unknown_key())
}

/// The key from `Authorization: Bearer …` or HTTP Basic with the key as the
/// user name (both are how Stripe SDKs authenticate), sent once. A value
/// that is not a key any vault key could be (undecodable, or holding bytes
/// no key has) is an unknown key, and the audit row names no key prefix.
fn presented_key(headers: &HeaderMap) -> Result<String, Refusal> {
    let mut sent = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = sent.next() else {
        return Err(Refusal::Refused(
            Decision::RefusedUnknownKey,
            StripeError::no_key(),
        ));
    };
    if sent.next().is_some() {
        return Err(Refusal::invalid(StripeError::invalid_request(
            "the Authorization header was sent more than once",
        )));
    }
    let value = value.to_str().map_err(|_| unknown_key())?;
    let (scheme, credentials) = value.trim().split_once(' ').ok_or_else(unknown_key)?;
    let key = if scheme.eq_ignore_ascii_case("bearer") {
        credentials.trim().to_owned()
    } else if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(credentials.trim())
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(unknown_key)?;
        decoded
            .split_once(':')
            .map(|(user, _)| user)
            .unwrap_or(&decoded)
            .to_owned()
    } else {
        return Err(unknown_key());
    };
    let plausible =
        !key.is_empty() && key.len() <= 200 && key.bytes().all(|b| b.is_ascii_graphic());
    if plausible {
        Ok(key)
    } else {
        Err(unknown_key())
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use chrono::Duration;

    use super::*;
    use crate::proxy::keys::test_key;

    fn presenting(values: &[&str]) -> Result<String, Refusal> {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(
                header::AUTHORIZATION,
                HeaderValue::from_bytes(value.as_bytes()).unwrap(),
            );
        }
        presented_key(&headers)
    }

    fn decision(refusal: Result<impl std::fmt::Debug, Refusal>) -> Decision {
        match refusal {
            Err(Refusal::Refused(decision, _)) => decision,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_key_is_read_as_stripe_sdks_send_it() {
        assert_eq!(presenting(&["Bearer vk_test_1"]).unwrap(), "vk_test_1");
        assert_eq!(presenting(&["bearer  vk_test_1 "]).unwrap(), "vk_test_1");
        // Basic with the key as the user name, with or without a password.
        assert_eq!(
            presenting(&["Basic dmtfdGVzdF8xOg=="]).unwrap(),
            "vk_test_1"
        );
        assert_eq!(presenting(&["Basic dmtfdGVzdF8x"]).unwrap(), "vk_test_1");
    }

    #[test]
    fn a_missing_repeated_or_impossible_key_is_refused() {
        let missing = presenting(&[]);
        assert!(matches!(&missing, Err(Refusal::Refused(_, e)) if e.code == "missing_api_key"));
        assert_eq!(
            decision(presenting(&["Bearer a", "Bearer b"])),
            Decision::RefusedInvalidRequest
        );
        for junk in [
            "vk_test_1",
            "Token vk_test_1",
            "Bearer ",
            "Basic !!!",
            "Bearer vk\u{e9}",
            "Bearer vk test",
        ] {
            assert_eq!(
                decision(presenting(&[junk])),
                Decision::RefusedUnknownKey,
                "{junk:?}"
            );
        }
        let long = format!("Bearer {}", "k".repeat(201));
        assert_eq!(decision(presenting(&[&long])), Decision::RefusedUnknownKey);
    }

    #[test]
    fn a_revoked_or_expired_key_is_refused() {
        let now = Utc::now();
        let key = test_key(|row| row.expires_at = now + Duration::hours(1));
        assert!(usable(&key, now).is_ok());
        assert_eq!(
            decision(usable(&key, now + Duration::hours(1))),
            Decision::RefusedExpired
        );
        let revoked = test_key(|row| row.revoked_at = Some(now));
        assert_eq!(decision(usable(&revoked, now)), Decision::RefusedRevoked);
    }
}
