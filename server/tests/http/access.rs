//! Who may do what: every API route against every token scope, and the
//! ways a token stops working.

use axum::http::{Method, StatusCode};
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{one_time_secret, TestApp};
use app::domain::{ApiScope, Role};

/// A key any test can aim its calls at.
async fn a_key(app: &TestApp) -> i64 {
    let token = app.api_token_with(&[ApiScope::KeysCreate]).await;
    let created = app
        .post_json(
            "/vault/keys",
            &token,
            json!({
                "label": "access-matrix",
                "billing_period": "2026-12",
                "currency": "usd",
                "expected_total_cents": 100_000,
                "allowed_endpoints": ["POST /v1/charges"],
                "expires_at": crate::helpers::in_a_month(),
            }),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    created.json()["id"].as_i64().unwrap()
}

/// The table comes from the builder that makes the router, so a route
/// added without a scope cannot exist, and a new route is in this matrix
/// the moment it is added.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn every_api_route_answers_only_tokens_holding_its_scope(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let table = server::api::routes(app.state.clone()).table().to_vec();
    assert!(table.len() >= 10, "the API has {} routes", table.len());
    let key = a_key(&app).await;

    let mut refusals = 0;
    for scope in ApiScope::ALL {
        let token = app.api_token_with(&[scope]).await;
        for route in &table {
            let path = route.path.replace("{id}", &key.to_string());
            let body = (route.method == Method::POST).then(|| json!({}));
            let response = app
                .api(route.method.as_str(), &path, Some(&token), body)
                .await;
            let call = format!("{} {} with {scope}", route.method, route.path);
            match route.scope {
                None => assert_eq!(response.status, StatusCode::OK, "{call}"),
                Some(needed) if needed == scope => assert!(
                    !matches!(
                        response.status,
                        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
                    ),
                    "{call} was refused: {} {}",
                    response.status,
                    response.body
                ),
                Some(needed) => {
                    refusals += 1;
                    assert_eq!(response.status, StatusCode::FORBIDDEN, "{call}");
                    assert_eq!(response.error_code(), "insufficient_scope", "{call}");
                    let message = response.json()["error"]["message"].to_string();
                    assert!(message.contains(needed.as_str()), "{call}: {message}");
                }
            }
        }
    }

    let logged = crate::helpers::count(
        &pool,
        "SELECT count(*) FROM operator_actions WHERE action = 'refused_api_call' AND via = 'api'",
    )
    .await;
    assert_eq!(logged, refusals, "every refusal is in the action log");
    // Only the keys:revoke token could revoke; its empty body was refused
    // for want of a reason, so the key is still active.
    let revoked: bool =
        sqlx::query_scalar("SELECT revoked_at IS NOT NULL FROM vault_keys WHERE id = $1")
            .bind(key)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(!revoked);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_token_without_the_revoke_scope_cannot_revoke_and_the_refusal_is_logged(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let key = a_key(&app).await;
    let billing_job = app.api_token_with(&[ApiScope::KeysCreate]).await;

    let refused = app
        .post_json(
            &format!("/vault/keys/{key}/revoke"),
            &billing_job,
            json!({ "reason": "let me through" }),
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(
        refused.json()["error"]["message"],
        "this API token lacks the `keys:revoke` scope this call needs; nothing was done"
    );
    let (revoked, details): (bool, serde_json::Value) = sqlx::query_as(
        "SELECT k.revoked_at IS NOT NULL, a.details FROM vault_keys k, operator_actions a
         WHERE k.id = $1 AND a.action = 'refused_api_call'",
    )
    .bind(key)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(!revoked);
    assert_eq!(
        details,
        json!({
            "method": "POST",
            "path": format!("/vault/keys/{key}/revoke"),
            "scope": "keys:revoke",
            "reason": "insufficient_scope",
        })
    );

    let revoker = app.api_token_with(&[ApiScope::KeysRevoke]).await;
    let revoked = app
        .post_json(
            &format!("/vault/keys/{key}/revoke"),
            &revoker,
            json!({ "reason": "the run is over" }),
        )
        .await;
    assert_eq!(revoked.status, StatusCode::OK, "{}", revoked.body);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn expired_revoked_and_unknown_tokens_are_refused_and_do_nothing(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let expired = app.api_token_with(&ApiScope::ALL).await;
    let revoked = app.api_token_with(&ApiScope::ALL).await;
    sqlx::query(
        "UPDATE api_tokens SET created_at = now() - interval '91 days', expires_at = now() - interval '1 day'
         WHERE token_prefix = $1",
    )
    .bind(app::ssr::secrets::prefix(&expired))
    .execute(&pool)
    .await
    .unwrap();
    let id: app::domain::ApiTokenId =
        sqlx::query_scalar("SELECT id FROM api_tokens WHERE token_prefix = $1")
            .bind(app::ssr::secrets::prefix(&revoked))
            .fetch_one(&pool)
            .await
            .unwrap();
    app::operators::tokens::revoke(&pool, app::actions::sql::Actor::Cli, id)
        .await
        .unwrap();

    let body = json!({
        "label": "never",
        "billing_period": "2026-12",
        "currency": "usd",
        "expected_total_cents": 100,
    });
    for (token, code, says) in [
        (expired.as_str(), "token_expired", "expired on"),
        (revoked.as_str(), "token_revoked", "revoked on"),
        ("vct_unknown", "unauthenticated", "unknown API token"),
    ] {
        let response = app.post_json("/vault/keys", token, body.clone()).await;
        assert_eq!(response.status, StatusCode::UNAUTHORIZED, "{code}");
        assert_eq!(response.error_code(), code);
        assert!(response.body.contains(says), "{}", response.body);
    }
    let keys = crate::helpers::count(&pool, "SELECT count(*) FROM vault_keys").await;
    assert_eq!(keys, 0);
    let used = crate::helpers::count(&pool, "SELECT count(last_used_at) FROM api_tokens").await;
    assert_eq!(used, 0, "a refused token is not marked used");
}

/// Every console route against every role, from the table the router is
/// built from: a role below the route's is refused 403 before the handler
/// runs (and the refusal is logged); a role at or above it gets through.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn every_console_route_answers_only_roles_that_allow_it(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let table = server::http::console_routes(app.state.clone())
        .table()
        .to_vec();
    assert!(table.len() >= 20, "the console has {} routes", table.len());

    let mut refusals = 0;
    for role in Role::ALL {
        let cookie = app
            .signed_in(&format!("{}@access.test", role.as_str()), role)
            .await;
        for route in &table {
            let Some(needed) = route.role else {
                continue; // signing in and out: open to anyone, tested in auth.rs
            };
            let path = route.path.replace("{id}", "999999");
            let response = if route.method == Method::GET {
                app.get(&path, Some(&cookie)).await
            } else {
                app.post_form(&path, "", Some(&cookie)).await
            };
            let call = format!("{} {} as {}", route.method, route.path, role.as_str());
            if role.allows(needed) {
                assert!(
                    !matches!(
                        response.status,
                        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
                    ),
                    "{call} was refused: {}",
                    response.status
                );
            } else {
                refusals += 1;
                assert_eq!(response.status, StatusCode::FORBIDDEN, "{call}");
                assert!(
                    response
                        .body
                        .contains(&format!("This needs the {} role", needed.as_str())),
                    "{call}: {}",
                    response.body
                );
            }
        }
    }

    let logged = crate::helpers::count(&pool, "SELECT count(*) FROM operator_actions WHERE action = 'refused_console_action' AND via = 'console'").await;
    assert_eq!(logged, refusals, "every refusal is in the action log");
    assert!(refusals > 20);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_admin_makes_a_scoped_token_on_the_tokens_page_and_revokes_it(pool: PgPool) {
    let app = TestApp::new(pool.clone());
    let admin = app.signed_in("admin@access.test", Role::Admin).await;

    let refused = app
        .post_form("/tokens", "name=billing+job&days=30", Some(&admin))
        .await;
    assert_eq!(refused.status, StatusCode::SEE_OTHER);
    assert!(app
        .notice("/tokens", &admin)
        .await
        .contains("tick at least one scope"));

    let created = app
        .post_form(
            "/tokens",
            "name=billing+job&scope=keys%3Acreate&scope=keys%3Aread&days=30",
            Some(&admin),
        )
        .await;
    assert_eq!(created.status, StatusCode::SEE_OTHER);
    let page = app.get("/tokens", Some(&created.revealing(&admin))).await;
    let secret = one_time_secret(&page.body).expect("the new token is shown once");
    assert!(secret.starts_with("vct_"), "{secret}");
    let again = app.get("/tokens", Some(&admin)).await;
    assert!(!again.body.contains(&secret), "shown only once");
    assert!(again.body.contains("keys:create") && again.body.contains("billing job"));

    let (id, scopes, days): (i64, Vec<String>, f64) = sqlx::query_as(
        "SELECT id, scopes, extract(epoch FROM expires_at - created_at)::float8 / 86400 FROM api_tokens",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(scopes, ["keys:create", "keys:read"]);
    assert!((days - 30.0).abs() < 0.01, "{days}");
    let listed = app.get_api("/vault/keys", &secret).await;
    assert_eq!(listed.status, StatusCode::OK);

    let revoked = app
        .post_form(&format!("/tokens/{id}/revoke"), "", Some(&admin))
        .await;
    assert_eq!(revoked.status, StatusCode::SEE_OTHER);
    let refused = app.get_api("/vault/keys", &secret).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.error_code(), "token_revoked");
    let logged: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM operator_actions WHERE subject_type = 'api_token' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        logged,
        ["create_api_token", "revoke_api_token", "refused_api_call"],
        "the call with the revoked token is logged against it"
    );
}
