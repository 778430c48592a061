//! Plots: per (account, op), demand, admitted rate and limit over time, and
//! the factor on a second axis. One row per run (policy), one column per
//! account shown. SVG and PNG from the same drawing code; text is set in a
//! font shipped with the binary, so a machine with no fonts draws the same.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::engine::{Run, Series};

/// Plotting failed.
pub type PlotError = Box<dyn std::error::Error + Send + Sync>;

const PANEL: (u32, u32) = (900, 330);
const MAX_COLUMNS: usize = 3;

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is a valid TrueType file bundled by the crate.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        );
    });
}

/// The items worth showing: limited ones with the highest peak demand over
/// their limit first, at most [`MAX_COLUMNS`].
fn chosen(run: &Run) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..run.series.len()).collect();
    let score = |s: &Series| {
        let peak = s.seconds.iter().map(|x| x.attempted).max().unwrap_or(0) as f64;
        match s.limit {
            Some(l) => peak / l,
            None => -1.0,
        }
    };
    // Each score once: a comparison that made its own read every second
    // of both series (a fleet's hour: a thousand series of 3 600).
    let scores: Vec<f64> = run.series.iter().map(score).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.truncate(MAX_COLUMNS);
    idx
}

/// Draws `runs` (one row each) to `path`, as SVG or PNG by its extension.
pub fn draw(path: &Path, title: &str, runs: &[Run]) -> Result<(), PlotError> {
    register_font();
    let columns = runs.first().map_or(1, |r| chosen(r).len().max(1));
    let size = (
        PANEL.0 * columns as u32,
        PANEL.1 * runs.len().max(1) as u32 + 50,
    );
    match path.extension().and_then(|e| e.to_str()) {
        Some("svg") => draw_on(
            SVGBackend::new(path, size).into_drawing_area(),
            title,
            runs,
            columns,
        ),
        Some("png") => draw_on(
            BitMapBackend::new(path, size).into_drawing_area(),
            title,
            runs,
            columns,
        ),
        other => Err(format!(
            "cannot draw to {}: extension {other:?}, expected svg or png",
            path.display()
        )
        .into()),
    }
}

fn draw_on<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    runs: &[Run],
    columns: usize,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 26))?;
    let rows = root.split_evenly((runs.len().max(1), columns));
    for (r, run) in runs.iter().enumerate() {
        for (c, &i) in chosen(run).iter().enumerate() {
            panel(&rows[r * columns + c], run, &run.series[i])?;
        }
    }
    root.present()?;
    Ok(())
}

/// The top of a panel's cost axis: room for the limit and what was
/// admitted, and for the demand unless it dwarfs them (it is then clipped
/// and its peak given in the legend).
fn y_max(s: &Series, peak_demand: f64) -> f64 {
    let peak_admitted = s.seconds.iter().map(|x| x.admitted).max().unwrap_or(0) as f64;
    match s.limit {
        Some(l) => (2.5 * l)
            .max(1.15 * peak_admitted)
            .min(1.15 * peak_demand.max(l)),
        None => 1.15 * peak_demand,
    }
    .max(1.0)
}

/// `op/account · policy · estimator · limit`.
fn caption(run: &Run, s: &Series) -> String {
    format!(
        "{}/{} · {} · {}{}",
        s.traffic.op,
        s.traffic.account,
        run.policy,
        run.estimator,
        s.limit.map_or(String::new(), |l| format!(" · limit {l}/s"))
    )
}

/// A legend's sample line.
fn legend_line(x: i32, y: i32, style: ShapeStyle) -> PathElement<(i32, i32)> {
    PathElement::new(vec![(x, y), (x + 18, y)], style)
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    run: &Run,
    s: &Series,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let duration = s.seconds.len().max(1) as f64;
    let peak_demand = s.seconds.iter().map(|x| x.attempted).max().unwrap_or(0) as f64;
    let ymax = y_max(s, peak_demand);
    let mut chart = ChartBuilder::on(area)
        .caption(caption(run, s), ("sans-serif", 17))
        .margin(10)
        .x_label_area_size(32)
        .y_label_area_size(60)
        .right_y_label_area_size(48)
        .build_cartesian_2d(0f64..duration, 0f64..ymax)?
        .set_secondary_coord(0f64..duration, 0f64..1.05);
    chart
        .configure_mesh()
        .x_desc("simulated seconds")
        .y_desc("cost per second")
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc("suppression factor")
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .draw()?;

    let at = |i: usize| i as f64 + 0.5;
    let clipped = peak_demand > ymax;
    let demand_label = if clipped {
        format!("demand (off scale: peak {peak_demand:.0}/s)")
    } else {
        "demand (attempted)".to_string()
    };
    let red = RGBColor(214, 39, 40);
    let blue = RGBColor(31, 119, 180);
    let orange = RGBColor(255, 127, 14);
    chart
        .draw_series(LineSeries::new(
            s.seconds
                .iter()
                .enumerate()
                .map(|(i, x)| (at(i), (x.attempted as f64).min(ymax))),
            red.stroke_width(2),
        ))?
        .label(demand_label)
        .legend(move |(x, y)| legend_line(x, y, red.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            s.seconds
                .iter()
                .enumerate()
                .map(|(i, x)| (at(i), x.admitted as f64)),
            blue.stroke_width(2),
        ))?
        .label("admitted")
        .legend(move |(x, y)| legend_line(x, y, blue.stroke_width(2)));
    if let Some(l) = s.limit {
        chart
            .draw_series(LineSeries::new(
                vec![(0.0, l), (duration, l)],
                BLACK.stroke_width(1),
            ))?
            .label("limit")
            .legend(|(x, y)| legend_line(x, y, BLACK.into()));
    }
    chart
        .draw_secondary_series(LineSeries::new(
            s.seconds
                .iter()
                .enumerate()
                .map(|(i, x)| (at(i) + 0.5, x.factor)),
            orange.stroke_width(2),
        ))?
        .label("factor (right axis)")
        .legend(move |(x, y)| legend_line(x, y, orange.stroke_width(2)));
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    Ok(())
}
