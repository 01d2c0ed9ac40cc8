use std::{future::Future, str::FromStr};

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;
use serde::{de::DeserializeOwned, Serialize};

use super::{ErrorPanel, RequireRole};
use crate::{domain::Role, error::AppError};

/// What a record page calls its record, and where it sends someone whose
/// path names no such record.
pub struct Record {
    /// As a heading: "Vault key".
    pub name: &'static str,
    /// Said when the path names none: "There is no such vault key."
    pub missing: &'static str,
    /// The page that lists them, and its link text.
    pub back: (&'static str, &'static str),
}

/// A viewer's page for the one record the `id` in the path names: loaded
/// by `load`, shown by `show`, or a "not found" page with the way back, or
/// what went wrong.
pub fn record_page<Id, T, Fut>(
    record: Record,
    load: impl Fn(Id) -> Fut + Copy + Send + Sync + 'static,
    show: impl Fn(T) -> AnyView + Copy + Send + Sync + 'static,
) -> impl IntoView
where
    Id: FromStr + Clone + PartialEq + Send + Sync + 'static,
    T: Clone + Send + Sync + Serialize + DeserializeOwned + 'static,
    Fut: Future<Output = Result<T, AppError>> + Send + 'static,
{
    let params = use_params_map();
    let id = move || params.with(|p| p.get("id").and_then(|id| id.parse::<Id>().ok()));
    let loaded = Resource::new(id, move |id| async move {
        match id {
            Some(id) => load(id).await,
            None => Err(AppError::NotFound),
        }
    });
    let Record {
        name,
        missing,
        back: (back, back_text),
    } = record;
    view! {
        <RequireRole role=Role::Viewer>
            <Suspense>
                {move || Suspend::new(async move {
                    match loaded.await {
                        Ok(value) => show(value),
                        Err(AppError::NotFound) => view! {
                            <Title text=format!("{name} not found")/>
                            <h1>{format!("{name} not found")}</h1>
                            <section class="panel"><p>{format!("{missing} ")} <a href=back>{back_text}</a></p></section>
                        }.into_any(),
                        Err(error) => view! { <h1>{name}</h1><ErrorPanel error/> }.into_any(),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}
