//! The audit log as CSV, exactly the filtered set: from the console
//! (`/audit.csv`, signed in) and the API (`/api/audit.csv`, API token).
//!
//! PostgreSQL writes the rows as CSV (`COPY … TO STDOUT`, the cells of
//! `audit_csv::copy_columns`); they stream through a small bounded channel
//! into the response, so memory stays constant whatever the size. When the
//! client goes away the channel closes, the query is cancelled in
//! PostgreSQL and its connection is not reused. The export is recorded in
//! the operator action log with its filter and row count once it ends.

use std::time::Duration;

use axum::{
    body::{Body, Bytes},
    extract::{RawQuery, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    Extension,
};
use bytes::BytesMut;
use futures::TryStreamExt;
use sqlx::{pool::PoolConnection, PgPool, Postgres};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::guard::Operator;
use super::{
    busy::{Busy, HeavyWork},
    error::HttpError,
};
use crate::api::{ApiError, ApiToken};
use app::{
    actions::sql::{self as actions, Actor},
    audit::{csv as audit_csv, sql as audit},
    domain::{AuditFilter, AuditQuery},
    error::AppError,
    ssr::AppState,
};

/// Bytes gathered before a chunk is sent.
const CHUNK: usize = 64 * 1024;
/// Chunks waiting for a slow client at most (so at most ~1 MiB buffered).
const CHUNKS_IN_FLIGHT: usize = 16;

pub async fn console(
    State(state): State<AppState>,
    Extension(heavy): Extension<HeavyWork>,
    Operator { actor, .. }: Operator,
    RawQuery(raw): RawQuery,
) -> Response {
    let query = read_query(raw.as_deref());
    let slot = match heavy.export() {
        Ok(slot) => slot,
        Err(Busy(message)) => {
            return HttpError::new(StatusCode::SERVICE_UNAVAILABLE, message).into_response()
        }
    };
    match query.parse() {
        Ok(filter) => export(slot, &state, query, filter, actor)
            .await
            .unwrap_or_else(|err| HttpError::from(err).into_response()),
        Err(err) => HttpError::from(AppError::from(err)).into_response(),
    }
}

pub async fn api(
    State(state): State<AppState>,
    Extension(heavy): Extension<HeavyWork>,
    token: ApiToken,
    RawQuery(raw): RawQuery,
) -> Response {
    let query = read_query(raw.as_deref());
    let filter = match query.parse() {
        Ok(filter) => filter,
        Err(err) => return ApiError::invalid(err.0).into_response(),
    };
    let slot = match heavy.export() {
        Ok(slot) => slot,
        Err(Busy(message)) => {
            return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message).into_response()
        }
    };
    export(slot, &state, query, filter, token.actor())
        .await
        .unwrap_or_else(|err| ApiError::from(err).into_response())
}

/// The query string's filters, read as the page reads them.
fn read_query(raw: Option<&str>) -> AuditQuery {
    AuditQuery::from_pairs(form_urlencoded::parse(raw.unwrap_or("").as_bytes())).filters_only()
}

/// Streams the export from the reads' database (the replica, if there is
/// one) and records it on the primary; `slot` is held until it ends.
async fn export(
    slot: OwnedSemaphorePermit,
    state: &AppState,
    query: AuditQuery,
    filter: AuditFilter,
    actor: Actor,
) -> Result<Response, AppError> {
    let mut conn = state.reads.pool.acquire().await?;
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await?;
    let (chunks, mut body) = mpsc::channel::<Result<Bytes, std::io::Error>>(CHUNKS_IN_FLIGHT);
    let filename = filename(&query);
    let (reads, primary) = (state.reads.pool.clone(), state.pool.clone());
    tokio::spawn(async move {
        let _slot = slot;
        let outcome = stream_rows(&mut conn, &filter, &chunks).await;
        let (rows, cancelled, last) = match outcome {
            Ok((rows, last)) => (rows, false, Some(last)),
            Err(Stop::ClientGone(rows)) => {
                // Mid-query: never hand this connection to anyone else.
                drop(conn.detach());
                stop_backend(&reads, backend).await;
                (rows, true, None)
            }
            Err(Stop::Failed(rows, err)) => {
                tracing::error!(error = %err, "the audit export failed");
                let _ = chunks
                    .send(Err(std::io::Error::other("the export failed")))
                    .await;
                (rows, true, None)
            }
        };
        // Recorded before the last chunk goes out: a client holding the
        // whole file can find its export in the action log.
        let details = serde_json::json!({
            "filter": query.query_string(), "rows": rows, "cancelled": cancelled,
        });
        if let Err(err) = actions::record(
            &primary,
            actor,
            "export_audit_csv",
            "audit_log",
            None,
            details,
        )
        .await
        {
            tracing::error!(error = %err, "could not record an audit export");
        }
        if let Some(last) = last {
            let _ = chunks.send(Ok(last)).await;
        }
    });
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{filename}\""),
            ),
            (header::CACHE_CONTROL, "no-store".to_owned()),
        ],
        Body::from_stream(futures::stream::poll_fn(move |cx| body.poll_recv(cx))),
    )
        .into_response())
}

/// Why streaming stopped before the end, with the rows sent until then.
enum Stop {
    ClientGone(u64),
    Failed(u64, String),
}

/// Sends the CSV in chunks as PostgreSQL writes it, all but the last:
/// returns the row count and the last chunk. COPY sends each row in a
/// message of its own, so counting messages counts rows.
async fn stream_rows(
    conn: &mut PoolConnection<Postgres>,
    filter: &AuditFilter,
    chunks: &mpsc::Sender<Result<Bytes, std::io::Error>>,
) -> Result<(u64, Bytes), Stop> {
    let failed = |sent, err: &dyn std::fmt::Display| Stop::Failed(sent, err.to_string());
    // Filter values are written into the COPY as literals (it takes no
    // parameters), quoted as this setting reads them.
    sqlx::query("SET standard_conforming_strings = on")
        .execute(&mut **conn)
        .await
        .map_err(|e| failed(0, &e))?;
    let mut rows = conn
        .copy_out_raw(&audit::export_copy(filter))
        .await
        .map_err(|e| failed(0, &e))?;
    let mut chunk = BytesMut::with_capacity(CHUNK * 2);
    chunk.extend_from_slice(audit_csv::HEADER.join(",").as_bytes());
    chunk.extend_from_slice(b"\n");
    let mut sent = 0u64;
    while let Some(row) = rows.try_next().await.map_err(|e| failed(sent, &e))? {
        chunk.extend_from_slice(&row);
        sent += 1;
        if chunk.len() >= CHUNK {
            let full = std::mem::replace(&mut chunk, BytesMut::with_capacity(CHUNK * 2));
            if chunks.send(Ok(full.freeze())).await.is_err() {
                return Err(Stop::ClientGone(sent));
            }
        }
    }
    Ok((sent, chunk.freeze()))
}

/// Ends the export's backend in PostgreSQL (the client stopped reading, and
/// its connection is closed) and waits, a few seconds at most, until its
/// query has stopped. Terminated rather than cancelled: a backend blocked
/// writing rows to a full socket acts on a termination at once, but on a
/// cancel only once the write completes, which it may never do.
async fn stop_backend(pool: &PgPool, backend: i32) {
    let stopped = async {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(backend)
            .execute(pool)
            .await?;
        loop {
            let active: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active')",
            )
            .bind(backend)
            .fetch_one(pool)
            .await?;
            if !active {
                return Ok::<_, sqlx::Error>(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if !matches!(
        tokio::time::timeout(Duration::from_secs(5), stopped).await,
        Ok(Ok(()))
    ) {
        tracing::warn!(
            backend,
            "could not confirm that an abandoned audit export query stopped"
        );
    }
}

/// `vaultcap-audit-20261130T140506Z-customer_id-cust_1.csv`: when, and the
/// filters in a form every file system takes.
fn filename(query: &AuditQuery) -> String {
    let filters: String = query
        .pairs()
        .into_iter()
        .filter(|(name, _)| !matches!(*name, "limit" | "after" | "before"))
        .flat_map(|(name, value)| [name.to_owned(), value.to_owned()])
        .collect::<Vec<_>>()
        .join("-")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    if filters.is_empty() {
        format!("vaultcap-audit-{stamp}.csv")
    } else {
        format!("vaultcap-audit-{stamp}-{filters}.csv")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filename_names_the_filters_safely() {
        let query = read_query(Some(
            "customer_id=cust%201%2F..&decision=refused&limit=50&after=1.2",
        ));
        let name = filename(&query);
        assert!(name.starts_with("vaultcap-audit-2"), "{name}");
        assert!(
            name.ends_with("-customer_id-cust_1___-decision-refused.csv"),
            "{name}"
        );
    }
}
