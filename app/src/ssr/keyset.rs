//! Keyset paging over `(at, id)`, newest first, for tables aliased `a`: the
//! audit log and the action log. Never OFFSET: a page is found through the
//! index whatever its depth, and stays the same while rows arrive.

use sqlx::{Postgres, QueryBuilder};

use crate::domain::{Cursor, Position};

/// Appends the position's condition (after a `WHERE`), the order and the
/// limit (one more row than the page, to know whether another follows).
pub fn push_page(sql: &mut QueryBuilder<'_, Postgres>, cursor: Option<Cursor>, limit: i64) {
    let (comparison, order) = match cursor {
        None => (None, "DESC"),
        Some(Cursor::After(p)) => (Some(("<", p)), "DESC"),
        Some(Cursor::Before(p)) => (Some((">", p)), "ASC"),
    };
    if let Some((op, p)) = comparison {
        sql.push(format!(" AND (a.at, a.id) {op} ("))
            .push_bind(p.at)
            .push(", ")
            .push_bind(p.id)
            .push(")");
    }
    sql.push(format!(" ORDER BY a.at {order}, a.id {order} LIMIT "))
        .push_bind(limit + 1);
}

/// Puts the fetched rows newest first and trims them to the page; returns
/// the cursors of the newer and older pages, when there are such pages.
pub fn settle<T>(
    rows: &mut Vec<T>,
    cursor: Option<Cursor>,
    limit: i64,
    position: impl Fn(&T) -> Position,
) -> (Option<Cursor>, Option<Cursor>) {
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    // Going forward there are newer rows whenever we came from a page;
    // going back there are older ones (the page we came from).
    let (has_newer, has_older) = match cursor {
        None => (false, more),
        Some(Cursor::After(_)) => (true, more),
        Some(Cursor::Before(_)) => {
            rows.reverse();
            (more, true)
        }
    };
    let newer = rows
        .first()
        .filter(|_| has_newer)
        .map(|row| Cursor::Before(position(row)));
    let older = rows
        .last()
        .filter(|_| has_older)
        .map(|row| Cursor::After(position(row)));
    (newer, older)
}
