//! Charts drawn on the server as SVG documents (plotters), so they read the
//! same with JavaScript off. They carry no text from users: labels that
//! identify series are the page's HTML legend, next to the chart.

use chrono::{DateTime, Duration, NaiveDate, Utc};
use plotters::prelude::*;

use crate::domain::{group_thousands, Cents, Currency, DayFigures};

const WIDTH: u32 = 760;
const HEIGHT: u32 = 300;
const INK: RGBColor = RGBColor(87, 96, 106);
const GRID: RGBColor = RGBColor(226, 230, 235);
/// Series colours, in legend order; the page's CSS uses the same ones.
pub const SERIES: [RGBColor; 8] = [
    RGBColor(31, 95, 173),
    RGBColor(196, 98, 16),
    RGBColor(46, 125, 50),
    RGBColor(142, 36, 170),
    RGBColor(0, 131, 143),
    RGBColor(173, 20, 87),
    RGBColor(93, 64, 55),
    RGBColor(84, 110, 122),
];
const SPENT: RGBColor = SERIES[0];
const CAP: RGBColor = RGBColor(183, 28, 28);
const EXPECTED: RGBColor = RGBColor(120, 120, 120);

/// `#1F5FAD` (as plotters writes it), for the HTML legend next to a chart.
pub fn css_colour(colour: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", colour.0, colour.1, colour.2)
}

/// A key's cumulative spend from `from` to `to` against its cap and
/// expected total. `hourly` is what it spent per hour, oldest first.
pub fn cumulative_spend(
    hourly: &[(DateTime<Utc>, Cents)],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    now: DateTime<Utc>,
    cap: Cents,
    expected: Cents,
    currency: &Currency,
) -> String {
    let hours = |at: DateTime<Utc>| (at - from).num_seconds() as f64 / 3600.0;
    let scale = 10f64.powi(currency.exponent() as i32);
    let major = |c: i64| c as f64 / scale;

    // A step line: flat between hours, rising at the end of each hour that
    // spent (a call is only known as spent once its hour's row exists).
    let mut total = 0i64;
    let mut points = vec![(0.0, 0.0)];
    for (hour, spent) in hourly {
        let at = (*hour).max(from);
        points.push((hours(at), major(total)));
        total += spent.0;
        points.push((
            hours((*hour + Duration::hours(1)).min(now).max(at)),
            major(total),
        ));
    }
    points.push((hours(now.min(to).max(from)), major(total)));

    let x_end = hours(to).max(1.0);
    let y_end = major(cap.0.max(expected.0).max(total)) * 1.08;
    let svg = draw_lines(
        (x_end, y_end.max(1.0)),
        &|h: &f64| {
            (from + Duration::minutes((h * 60.0) as i64))
                .format("%b %d")
                .to_string()
        },
        &|v: &f64| axis_amount(*v),
        &[
            (
                vec![(0.0, major(cap.0)), (x_end, major(cap.0))],
                CAP,
                Stroke::Dashed,
            ),
            (
                vec![(0.0, major(expected.0)), (x_end, major(expected.0))],
                EXPECTED,
                Stroke::Dashed,
            ),
            (points, SPENT, Stroke::Solid),
        ],
    );
    with_title(
        svg,
        "Cumulative spend against the cap and the expected total",
    )
}

/// The figures of a cumulative chart as table rows: a row per day (UTC)
/// that spent anything, with what it spent and the total to date.
pub fn cumulative_by_day(hourly: &[(DateTime<Utc>, Cents)]) -> Vec<DayFigures> {
    let mut rows: Vec<DayFigures> = Vec::new();
    let mut to_date = 0i64;
    for (hour, spent) in hourly {
        to_date += spent.0;
        let day = hour.date_naive().to_string();
        match rows.last_mut() {
            Some(row) if row.day == day => {
                row.amounts[0].0 += spent.0;
                row.amounts[1] = Cents(to_date);
            }
            _ => rows.push(DayFigures {
                day,
                amounts: vec![*spent, Cents(to_date)],
            }),
        }
    }
    rows
}

/// The figures of a daily chart as table rows: a row per day on which any
/// series spent, an amount per series (zero where it spent nothing).
pub fn by_day(series: &[Vec<(NaiveDate, Cents)>]) -> Vec<DayFigures> {
    let mut days: Vec<NaiveDate> = series.iter().flatten().map(|(day, _)| *day).collect();
    days.sort_unstable();
    days.dedup();
    days.into_iter()
        .map(|day| DayFigures {
            day: day.to_string(),
            amounts: series
                .iter()
                .map(|points| {
                    Cents(
                        points
                            .iter()
                            .filter(|(d, _)| *d == day)
                            .map(|(_, c)| c.0)
                            .sum(),
                    )
                })
                .collect(),
        })
        .collect()
}

/// Daily spend per series on an axis of the days `first..=last`, drawn up
/// to `through` (today: days to come are not zero, they are unknown); each
/// series lists (day, spent) for the days it spent anything.
pub fn daily_spend(
    series: &[Vec<(NaiveDate, Cents)>],
    first: NaiveDate,
    last: NaiveDate,
    through: NaiveDate,
    currency: &Currency,
) -> String {
    let scale = 10f64.powi(currency.exponent() as i32);
    let days = (last - first).num_days().max(1) as f64;
    let day_of = |d: NaiveDate| (d - first).num_days() as f64;
    let top = series.iter().flatten().map(|(_, c)| c.0).max().unwrap_or(0) as f64 / scale;
    let lines: Vec<Line> = series
        .iter()
        .zip(SERIES.iter().cycle())
        .map(|(points, colour)| {
            // Every day so far, zero where nothing was spent.
            let drawn = (through.min(last) - first).num_days().max(0) as usize + 1;
            let mut spent = vec![0.0; drawn];
            for (day, c) in points {
                if let Some(slot) = spent.get_mut(day_of(*day) as usize) {
                    *slot += c.0 as f64 / scale;
                }
            }
            let line = spent
                .into_iter()
                .enumerate()
                .map(|(d, v)| (d as f64, v))
                .collect();
            (line, *colour, Stroke::Marked)
        })
        .collect();
    let svg = draw_lines(
        (days, (top * 1.1).max(1.0)),
        &|d: &f64| {
            (first + Duration::days(*d as i64))
                .format("%b %d")
                .to_string()
        },
        &|v: &f64| axis_amount(*v),
        &lines,
    );
    with_title(svg, "Daily spend per key")
}

#[derive(Clone, Copy)]
enum Stroke {
    Solid,
    Dashed,
    /// Solid with a dot at each point, so a single day still shows.
    Marked,
}

/// A series: its points, colour and stroke.
type Line = (Vec<(f64, f64)>, RGBColor, Stroke);

/// An SVG with axes from the origin to `(x_end, y_end)` and the given
/// lines. Drawing into a string cannot fail but
/// for a bug; the chart is then left as far as it got.
fn draw_lines(
    (x_end, y_end): (f64, f64),
    x_label: &dyn Fn(&f64) -> String,
    y_label: &dyn Fn(&f64) -> String,
    lines: &[Line],
) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        if let Err(err) = draw(&root, (x_end, y_end), x_label, y_label, lines) {
            tracing::error!(error = %err, "a chart could not be drawn");
        }
    }
    svg
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw(
    root: &Area<'_>,
    (x_end, y_end): (f64, f64),
    x_label: &dyn Fn(&f64) -> String,
    y_label: &dyn Fn(&f64) -> String,
    lines: &[Line],
) -> Result<(), String> {
    let failed = |err: DrawingAreaErrorKind<_>| err.to_string();
    root.fill(&WHITE).map_err(failed)?;
    let mut chart = ChartBuilder::on(root)
        .margin(12)
        .margin_right(32)
        .x_label_area_size(28)
        .y_label_area_size(84)
        .build_cartesian_2d(0f64..x_end, 0f64..y_end)
        .map_err(failed)?;
    let font = ("sans-serif", 12).into_font().color(&INK);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .max_light_lines(0)
        .bold_line_style(GRID)
        .axis_style(INK)
        .x_labels(7)
        .y_labels(6)
        .label_style(font)
        .x_label_formatter(x_label)
        .y_label_formatter(y_label)
        .draw()
        .map_err(failed)?;
    for (points, colour, stroke) in lines {
        let points = points.iter().copied();
        match stroke {
            Stroke::Dashed => chart
                .draw_series(DashedLineSeries::new(points, 6, 4, colour.stroke_width(1)))
                .map(drop),
            Stroke::Solid => chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))
                .map(drop),
            Stroke::Marked => {
                let line = LineSeries::new(points.clone(), colour.stroke_width(2));
                chart.draw_series(line).map_err(failed)?;
                chart
                    .draw_series(points.map(|p| Circle::new(p, 3, colour.filled())))
                    .map(drop)
            }
        }
        .map_err(failed)?;
    }
    root.present().map_err(failed)?;
    Ok(())
}

/// `12,500` for an axis (major units, no decimals: the table has those).
fn axis_amount(value: f64) -> String {
    group_thousands(value.max(0.0).round() as u64)
}

/// Makes the SVG an image with an accessible name and lets CSS size it.
fn with_title(svg: String, title: &str) -> String {
    svg.replacen(
        "<svg ",
        &format!(r#"<svg role="img" aria-label="{title}" preserveAspectRatio="xMinYMin meet" "#),
        1,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spend_chart_is_an_svg_image_with_a_line_per_series() {
        let from = "2026-07-01T00:00:00Z".parse().unwrap();
        let to = "2026-08-01T00:00:00Z".parse().unwrap();
        let now = "2026-07-10T12:00:00Z".parse().unwrap();
        let spent = [("2026-07-03T05:00:00Z".parse().unwrap(), Cents(450_000))];
        let svg = cumulative_spend(
            &spent,
            from,
            to,
            now,
            Cents(550_000),
            Cents(500_000),
            &Currency::usd(),
        );
        assert!(svg.starts_with("<svg role=\"img\""), "{}", &svg[..80]);
        assert!(svg.contains("aria-label=\"Cumulative spend"));
        assert!(svg.contains(&css_colour(SPENT)), "the spend line is drawn");
        assert!(svg.contains(&css_colour(CAP)), "the cap line is drawn");
        assert!(svg.contains("5,000"), "the axis is labelled in major units");
    }

    fn row(day: &str, cents: &[i64]) -> DayFigures {
        DayFigures {
            day: day.to_owned(),
            amounts: cents.iter().copied().map(Cents).collect(),
        }
    }

    #[test]
    fn the_cumulative_figures_sum_each_day_and_carry_the_total() {
        let at = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        let hourly = [
            (at("2026-07-03T05:00:00Z"), Cents(100)),
            (at("2026-07-03T23:00:00Z"), Cents(50)),
            (at("2026-07-05T00:00:00Z"), Cents(7)),
        ];
        assert_eq!(
            cumulative_by_day(&hourly),
            [row("2026-07-03", &[150, 150]), row("2026-07-05", &[7, 157])]
        );
    }

    #[test]
    fn the_daily_figures_have_a_row_per_day_and_a_column_per_series() {
        let day = |d: u32| NaiveDate::from_ymd_opt(2026, 7, d).unwrap();
        let series = [
            vec![(day(2), Cents(10)), (day(4), Cents(20))],
            vec![(day(4), Cents(5))],
        ];
        assert_eq!(
            by_day(&series),
            [row("2026-07-02", &[10, 0]), row("2026-07-04", &[20, 5])]
        );
    }
}
