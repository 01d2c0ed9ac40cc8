use leptos::prelude::*;
use leptos_meta::Title;

use super::{
    action_log::{ActionDetails, ActionWhat},
    overview::state_class,
};
use crate::{
    components::{col, num, record_page, utc, Amount, DataTable, Record},
    domain::{Me, PeriodCloseView, PeriodReport, PeriodState, Role},
    server_fns::get_period_close,
};

/// One billing period's close: the money per currency, findings, keys and
/// cap increases, the period's action log, and the four-eyes sign-off. Once
/// signed, the page shows the frozen report and offers its CSV pack; it
/// prints as a report (the print stylesheet drops the frame and forms).
#[component]
pub fn PeriodClosePage() -> impl IntoView {
    record_page(
        Record {
            name: "Period close",
            missing: "There is no such billing period (write it as YYYY-MM).",
            back: ("/", "Back to the overview"),
        },
        get_period_close,
        |view: PeriodCloseView| view! { <Close view/> }.into_any(),
    )
}

#[component]
fn Close(view: PeriodCloseView) -> impl IntoView {
    let me = use_context::<Me>();
    let period = view.report.period;
    let state = view.state();
    let title = format!("Close of {period}");
    let pack = (state == PeriodState::SignedOff).then(|| {
        view! {
            <a class="button button-quiet no-print" href=format!("/periods/{period}/close-pack.zip")
                download>"Download CSV pack"</a>
        }
    });
    view! {
        <Title text=title.clone()/>
        <p class="breadcrumb no-print"><a href="/">"Overview"</a>{format!(" / {title}")}</p>
        <div class="page-head">
            <h1>{title}</h1>
            <div class="actions">
                <span class=format!("period-state {}", state_class(state)) data-testid="period-state">{state.label()}</span>
                {pack}
            </div>
        </div>
        <SignOff view=view.clone() me/>
        <Money report=view.report.clone() signed={state == PeriodState::SignedOff}/>
        <Findings report=view.report.clone()/>
        <Keys report=view.report.clone()/>
        <CapIncreases report=view.report.clone()/>
        <PeriodActions view=view.clone()/>
    }
}

/// Where the close stands, what stands in its way, and the one form the
/// signed-in person can use next (or why there is none).
#[component]
fn SignOff(view: PeriodCloseView, me: Option<Me>) -> impl IntoView {
    let period = view.report.period;
    let blockers = view.report.blockers();
    let role = me.as_ref().map(|me| me.role);
    let may = |needed: Role| role.is_some_and(|role| role.allows(needed));
    let body = match (&view.close, view.ended) {
        (None, false) => view! {
            <p>{format!("{period} ends on {} UTC; its close is prepared after that.", period.ends_at().format("%Y-%m-%d %H:%M"))}</p>
        }.into_any(),
        (None, true) => view! {
            <p>"Nobody has prepared this period's close."</p>
            <Blockers blockers=blockers.clone()/>
            {may(Role::Operator).then(|| view! {
                <form class="stacked no-print" method="post" action=format!("/periods/{period}/prepare")>
                    <div class="field">
                        <label for="close-note">"Note for the approver (optional)"</label>
                        <textarea id="close-note" name="note" rows="3" maxlength="2000"></textarea>
                    </div>
                    <button type="submit" class="button button-primary">{format!("Prepare the close of {period}")}</button>
                </form>
            })}
        }.into_any(),
        (Some(close), _) => {
            let close = close.clone();
            match (close.signed_at, close.signed_by.clone()) {
                (Some(at), Some(by)) => view! {
                    <dl class="facts">
                        <div><dt>"Prepared"</dt><dd>{format!("{} by {}", utc(close.prepared_at), close.prepared_by)}</dd></div>
                        <div><dt>"Signed off"</dt><dd data-testid="signed-by">{format!("{} by {by}", utc(at))}</dd></div>
                        {close.note.clone().map(|note| view! { <div><dt>"Note"</dt><dd>{note}</dd></div> })}
                        <div><dt>"Report SHA-256"</dt><dd><code class="hash">{close.report_sha256.clone().unwrap_or_default()}</code></dd></div>
                    </dl>
                    {(view.open_after_sign_off > 0).then(|| view! {
                        <p class="caution" data-testid="open-after-sign-off">
                            {format!("{} finding(s) of {period} are open now, found or reopened after the sign-off; the signed report cannot show them. ", view.open_after_sign_off)}
                            <a href=format!("/reconciliation?period={period}&state=open")>{format!("Open findings of {period}")}</a>
                        </p>
                    })}
                    {if view.report_intact {
                        view! { <p class="hint">"The report below is the one signed: its bytes still match the stored hash."</p> }.into_any()
                    } else {
                        view! { <p class="error" role="alert">"The stored report no longer matches the hash it was signed with: it was changed after sign-off."</p> }.into_any()
                    }}
                }.into_any(),
                _ => {
                    let mine = me.as_ref().is_some_and(|me| me.id == close.prepared_by_id);
                    let live_keys = view.report.keys.iter().filter(|k| k.revoked_at.is_none()).count();
                    let approver = may(Role::Approver);
                    let can_sign = approver && !mine && blockers.is_empty();
                    view! {
                        <p data-testid="prepared-by">{format!("Prepared by {} at {}.", close.prepared_by, utc(close.prepared_at))}</p>
                        {close.note.clone().map(|note| view! { <blockquote class="note">{note}</blockquote> })}
                        <Blockers blockers=blockers.clone()/>
                        {match (approver, mine, can_sign) {
                            (_, _, true) => view! {
                                <p>{format!("Signing off freezes this report with its hash and revokes the {live_keys} live key(s) of {period}.")}</p>
                            }.into_any(),
                            (true, true, _) => view! {
                                <p class="hint" data-testid="four-eyes">"You prepared this close, so another approver signs it off (four-eyes rule)."</p>
                            }.into_any(),
                            (false, _, _) => view! {
                                <p class="hint">"An approver signs the close off."</p>
                            }.into_any(),
                            // Blockers (listed above) stand in the way.
                            (true, false, false) => ().into_any(),
                        }}
                        <div class="form-row no-print">
                            {can_sign.then(|| view! {
                                <form method="post" action=format!("/periods/{period}/sign-off")>
                                    <button type="submit" class="button button-primary">{format!("Sign off {period}")}</button>
                                </form>
                            })}
                            {may(Role::Operator).then(|| view! {
                                <form method="post" action=format!("/periods/{period}/withdraw")>
                                    <button type="submit" class="button button-quiet">"Withdraw the close"</button>
                                </form>
                            })}
                        </div>
                    }.into_any()
                }
            }
        }
    };
    view! {
        <section class="panel" aria-labelledby="signoff-heading">
            <h2 id="signoff-heading">"Sign-off"</h2>
            {body}
        </section>
    }
}

#[component]
fn Blockers(blockers: Vec<String>) -> impl IntoView {
    if blockers.is_empty() {
        return view! { <p class="hint" data-testid="blockers">"Nothing stands in the way of the sign-off."</p> }
            .into_any();
    }
    view! {
        <div data-testid="blockers">
            <p>"Before it can be signed off:"</p>
            <ul>{blockers.into_iter().map(|b| view! { <li>{b}</li> }).collect_view()}</ul>
        </div>
    }
    .into_any()
}

#[component]
fn Money(report: PeriodReport, signed: bool) -> impl IntoView {
    let period = report.period;
    view! {
        <section class="panel" aria-labelledby="money-heading">
            <h2 id="money-heading">"Money"</h2>
            <p class="hint">{format!("As of {}. Charged and refunded: Stripe's charges for {period}, kept current by Stripe's events; {}.", utc(report.as_of), match report.synced_at {
                Some(at) => format!("last synced from Stripe at {}", utc(at)),
                None => "never synced from Stripe".to_owned(),
            })}</p>
            {(!report.synced_after_end()).then(|| view! {
                <p class="caution" data-testid="sync-caution">{if signed {
                    format!("Signed off without a sync from Stripe after {period} ended: what Stripe's events missed at the month's end is not in these figures.")
                } else {
                    format!("Not synced from Stripe since {period} ended: sync it on the Reconciliation page before signing off, so that whatever Stripe's events missed at the month's end is counted.")
                }}</p>
            })}
            {if report.money.is_empty() {
                view! { <p>{format!("No key was issued and no charge synced for {period}.")}</p> }.into_any()
            } else {
                view! {
                    <DataTable class="data totals" columns=vec![col("Currency"), num("Keys"), num("Expected"), num("Capped"), num("Metered"), num("Charged"), num("Refunded"), num("Net")] caption="Money per currency" testid="period-money">
                        {report.money.into_iter().map(|m| {
                            let c = m.currency.clone();
                            view! {
                                <tr>
                                    <th scope="row">{c.to_string()}</th>
                                    <td class="num">{m.keys}</td>
                                    <td class="num"><Amount cents=m.expected currency=c.clone()/></td>
                                    <td class="num"><Amount cents=m.capped currency=c.clone()/></td>
                                    <td class="num"><Amount cents=m.metered currency=c.clone()/></td>
                                    <td class="num"><Amount cents=m.charged currency=c.clone()/></td>
                                    <td class="num"><Amount cents=m.refunded currency=c.clone()/></td>
                                    <td class="num"><Amount cents=m.net() currency=c/></td>
                                </tr>
                            }
                        }).collect_view()}
                    </DataTable>
                }.into_any()
            }}
            <p class="hint">{format!("{} for the period's keys.", crate::domain::counted(report.calls.unsigned_abs() as usize, "call audited", "calls audited"))}</p>
        </section>
    }
}

#[component]
fn Findings(report: PeriodReport) -> impl IntoView {
    let period = report.period;
    let open = report.open_findings();
    let summary = format!(
        "{} findings: {open} open, {} resolved.",
        report.findings.len(),
        report.findings.len() - open
    );
    view! {
        <section class="panel" aria-labelledby="findings-heading">
            <h2 id="findings-heading">"Findings"</h2>
            <p>{summary} " " <a class="no-print" href=format!("/reconciliation?period={period}")>{format!("Reconciliation {period}")}</a></p>
            {(!report.findings.is_empty()).then(|| view! {
                <DataTable class="data compact" columns=vec![col("#"), col("Kind"), col("Customer"), num("At risk"), col("Resolution")] caption="Findings of the period">
                    {report.findings.into_iter().map(|f| view! {
                        <tr>
                            <td><a href=format!("/reconciliation/{}", f.id)>{f.id.to_string()}</a></td>
                            <td>{f.kind.one()}</td>
                            <td>{f.customer_id.clone()}</td>
                            <td class="num"><Amount cents=f.at_risk currency=f.currency.clone()/></td>
                            <td>{match (&f.resolution, &f.resolved_by) {
                                (None, _) => "open".to_owned(),
                                (Some(r), Some(by)) => format!("{r} by {by}"),
                                (Some(r), None) => r.clone(),
                            }}</td>
                        </tr>
                    }).collect_view()}
                </DataTable>
            })}
        </section>
    }
}

/// One of the report's lists: its heading, then its table, or `empty`
/// when it has no rows.
struct Listing {
    id: &'static str,
    heading: &'static str,
    empty: &'static str,
    caption: &'static str,
    class: &'static str,
}

impl Listing {
    fn show(
        self,
        rows: usize,
        head: impl IntoView + 'static,
        body: impl IntoView + 'static,
    ) -> AnyView {
        let Listing {
            id,
            heading,
            empty,
            caption,
            class,
        } = self;
        let content = if rows == 0 {
            view! { <p class="hint">{empty}</p> }.into_any()
        } else {
            view! {
                <div class="table-scroll" tabindex="0">
                    <table class=class>
                        <caption class="visually-hidden">{caption}</caption>
                        <thead><tr>{head}</tr></thead>
                        <tbody>{body}</tbody>
                    </table>
                </div>
            }
            .into_any()
        };
        view! {
            <section class="panel" aria-labelledby=id>
                <h2 id=id>{heading}</h2>
                {content}
            </section>
        }
        .into_any()
    }
}

#[component]
fn Keys(report: PeriodReport) -> impl IntoView {
    let as_of = report.as_of;
    Listing {
        id: "keys-heading",
        heading: "Keys and their caps",
        empty: "No key was issued for this period.",
        caption: "Keys of the period",
        class: "data compact",
    }
    .show(
        report.keys.len(),
        view! {
            <th scope="col">"Key"</th>
            <th scope="col" class="num">"Expected"</th>
            <th scope="col" class="num">"Cap"</th>
            <th scope="col" class="num">"Spent"</th>
            <th scope="col">"Status"</th>
        },
        report
            .keys
            .into_iter()
            .map(|k| {
                view! {
                    <tr>
                        <td><a href=format!("/keys/{}", k.id)>{k.label.clone()}</a></td>
                        <td class="num"><Amount cents=k.expected currency=k.currency.clone()/></td>
                        <td class="num"><Amount cents=k.cap currency=k.currency.clone()/></td>
                        <td class="num"><Amount cents=k.spent currency=k.currency.clone()/></td>
                        <td>{k.status(as_of).as_str()}</td>
                    </tr>
                }
            })
            .collect_view(),
    )
}

#[component]
fn CapIncreases(report: PeriodReport) -> impl IntoView {
    Listing {
        id: "increases-heading",
        heading: "Cap increases",
        empty: "Nobody asked for a higher cap in this period.",
        caption: "Cap increases of the period",
        class: "data compact",
    }
    .show(
        report.cap_increases.len(),
        view! {
            <th scope="col">"Key"</th><th scope="col" class="num">"From"</th>
            <th scope="col" class="num">"To"</th><th scope="col">"Asked by"</th>
            <th scope="col">"Decision"</th>
        },
        report.cap_increases.into_iter().map(|r| view! {
            <tr>
                <td><a href=format!("/keys/{}", r.vault_key_id)>{r.key_label.clone()}</a></td>
                <td class="num"><Amount cents=r.from_cap currency=r.currency.clone()/></td>
                <td class="num"><Amount cents=r.to_cap currency=r.currency.clone()/></td>
                <td>{r.requested_by.clone()}</td>
                <td>{match (&r.decision, &r.decided_by) {
                    (Some(d), Some(by)) => format!("{d} by {by}"),
                    _ => "undecided".to_owned(),
                }}</td>
            </tr>
        }).collect_view(),
    )
}

#[component]
fn PeriodActions(view: PeriodCloseView) -> impl IntoView {
    Listing {
        id: "period-actions-heading",
        heading: "Action log for the period",
        empty: "Nobody has acted on this period, its keys or its findings yet.",
        caption: "Actions on the period, its keys and its findings, newest first",
        class: "data compact stack",
    }
    .show(
        view.actions.len(),
        view! {
            <th scope="col">"Time (UTC)"</th><th scope="col">"Who"</th>
            <th scope="col">"What"</th><th scope="col">"Details"</th>
        },
        view.actions.into_iter().map(|entry| view! {
            <tr>
                <td class="nowrap" data-label="Time (UTC)">{entry.at.format("%Y-%m-%d %H:%M:%S").to_string()}</td>
                <td data-label="Who">{entry.who.clone()}</td>
                <td data-label="What"><ActionWhat entry=entry.clone()/></td>
                <td data-label="Details"><ActionDetails entry/></td>
            </tr>
        }).collect_view(),
    )
}
