//! The spend-cap proxy: a drop-in Stripe API base for billing jobs. A call
//! goes through named steps, each in its own file:
//!
//! 1. [`authenticate`]: the vault key it presents, usable now;
//! 2. [`policy`]: what the key may call and what the call says, read as
//!    Stripe reads it: refused, or admitted with the amount it moves;
//! 3. [`reserve`]: that amount held against the key's cap, committed
//!    before anything leaves;
//! 4. [`forward`]: sent to Stripe with the real key;
//! 5. [`settle`]: Stripe's answer settles the reservation, and the call's
//!    audit row is written with it.
//!
//! A step that refuses returns a [`Refusal`]: the call is audited and
//! answered in Stripe's error shape. Every call that reaches the proxy
//! leaves exactly one audit row.

mod authenticate;
mod call;
mod forward;
mod intents;
mod keys;
mod ledger;
mod policy;
mod request;
mod reserve;
mod settle;
mod stripe_error;
pub mod upstream;

use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, DefaultBodyLimit, State},
    http::{HeaderMap, Method, Uri},
    response::{IntoResponse, Response},
    routing::any,
    Router,
};
use sqlx::PgPool;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use app::keys::spend;
use authenticate::authenticate;
use call::{Call, Refusal, Request};
use forward::forward;
pub use keys::KeyLookup;
pub use ledger::{Ledger, LedgerError, RESERVE_QUEUE};
use policy::policy;
use reserve::reserve;
pub(crate) use settle::answered as settle_answer;
use settle::settle;
use stripe_error::StripeError;
use upstream::Upstream;

/// Stripe accepts request bodies far smaller than this.
pub const MAX_BODY: usize = 1024 * 1024;

#[derive(Clone)]
pub struct ProxyState {
    pub pool: PgPool,
    pub upstream: Upstream,
    pub ledger: Ledger,
    pub keys: KeyLookup,
    /// Every call in flight, so shutdown can wait for each to settle.
    pub calls: TaskTracker,
}

pub fn router(state: ProxyState) -> Router {
    Router::new()
        .route("/v1/{*rest}", any(handle))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

async fn handle(
    State(state): State<ProxyState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let request = Request {
        method,
        uri,
        headers,
        body,
    };
    // A call runs to its end even if the client hangs up: once it has
    // reserved, it must forward and settle, or money is left hanging. The
    // tracker lets shutdown wait for it after its connection is gone.
    let calls = state.calls.clone();
    let call = Call::new(&request);
    let span = tracing::info_span!("proxy_call", request_id = %call.entry.request_id,
        method = %request.method, path = request.uri.path());
    let call = calls.spawn(decide_and_forward(state, request, call).instrument(span));
    call.await.unwrap_or_else(|err| {
        tracing::error!(error = %err, "a proxied call panicked");
        StripeError::internal().into_response()
    })
}

/// The steps, in order: the first refusal ends the call.
async fn decide_and_forward(state: ProxyState, request: Request, mut call: Call) -> Response {
    let entry = &mut call.entry;
    let decided = async {
        request::check_target(&request.method, &request.uri).map_err(Refusal::invalid)?;
        let key = authenticate(&state, &request, entry).await?;
        let intent_metered =
            async |intent: &str| spend::intent_metered(&state.pool, key.row.id, intent).await;
        let configured = state.upstream.is_configured();
        let admitted = policy(&key, &request, configured, intent_metered, entry).await?;
        let held = reserve(&state, &request, &key, &admitted, entry).await?;
        Ok::<_, Refusal>((admitted, held))
    };
    let (admitted, held) = match decided.await {
        Ok(go) => go,
        Err(refusal) => return call.refuse(&state.ledger, refusal).await,
    };

    let forwarded = forward(&state.upstream, &request, admitted.body.clone()).await;
    let (record, response) = settle(&state.upstream, forwarded, admitted, held, call).await;
    let request_id = record.entry.request_id;
    // Answered once the settlement and the audit row are committed: the
    // same request sent again after the answer finds the call settled
    // (Stripe's replay, not a 409), and a process killed after answering
    // leaves no call without Stripe's answer in its audit row. Answering
    // first was measured (issue 20): a third more calls/s at 8 in flight, a
    // fifth at 64, nothing for a lone call (the next call's reservation
    // waits behind this settlement in the one writer).
    if let Err(err) = state.ledger.record(record).await {
        crate::metrics::ledger_failed("settle");
        // Stripe has answered; the reservation stays pending and the
        // sweep records it as outcome unknown.
        tracing::error!(error = %err, %request_id, "could not settle a forwarded call");
    }
    response
}
