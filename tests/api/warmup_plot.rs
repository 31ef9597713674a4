//! `cargo run --example warmup_plot`, replayed: the table it prints (and docs/bench/warmup.md
//! shows) is what the rate limit and the shaper do, second by second, on a manual clock and
//! tokio's paused clock.
//!
//! Pins docs/design.md section 1 ("Other kinds": warm-up) and section 1 ("Shaping").

#[path = "../../examples/warmup_plot.rs"]
#[allow(dead_code)]
mod example;

fn per_second(times: &[f64]) -> Vec<usize> {
    (0..24)
        .map(|s| {
            let s = f64::from(s);
            times.iter().filter(|&&t| t >= s && t < s + 1.0).count()
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_plotted_run_admits_what_docs_bench_warmup_md_shows() {
    let shaped = example::departures().await;
    let limited = example::admissions();
    assert_eq!(
        per_second(&shaped),
        [
            36, 41, 50, 73, 100, 100, // cold start: a third of the rate, full after 4 s
            0, 0, 0, // 3 s idle: half way cold
            59, 92, 100, 100, // resumes at half the rate
            0, 0, 0, 0, 0, 0, 0, // 7 s idle: cold again
            36, 41, 50, 73, // the same slow start
        ]
    );
    assert_eq!(
        per_second(&limited),
        [
            36, 41, 50, 73, 99, 100, 0, 0, 0, 58, 91, 100, 100, 0, 0, 0, 0, 0, 0, 0, 36, 41, 50,
            73,
        ]
    );
    let table = example::table(&limited, &shaped);
    let doc = std::fs::read_to_string("docs/bench/warmup.md").unwrap();
    assert!(
        doc.contains(table.trim_end()),
        "docs/bench/warmup.md is stale"
    );
    let svg = example::svg(&example::rates(&limited), &example::rates(&shaped));
    assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    assert_eq!(svg.matches("<polyline").count(), 2);
}
