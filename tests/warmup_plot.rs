//! `cargo run --example warmup_plot`, replayed: the table it prints (and docs/bench/warmup.md
//! shows) is what the shaper does, second by second, on tokio's paused clock.

#[path = "../examples/warmup_plot.rs"]
#[allow(dead_code)]
mod warmup_plot;

#[tokio::test(start_paused = true)]
async fn the_plotted_run_admits_what_docs_bench_warmup_md_shows() {
    let times = warmup_plot::departures().await;
    let per_second: Vec<usize> = (0..24)
        .map(|s| {
            let s = f64::from(s);
            times.iter().filter(|&&t| t >= s && t < s + 1.0).count()
        })
        .collect();
    assert_eq!(
        per_second,
        [
            36, 41, 50, 73, 100, 100, // cold start: a third of the rate, full after 4 s
            0, 0, 0, // 3 s idle: half way cold
            59, 92, 100, 100, // resumes at half the rate
            0, 0, 0, 0, 0, 0, 0, // 7 s idle: cold again
            36, 41, 50, 73, // the same slow start
        ]
    );
    let table = warmup_plot::table(&times);
    assert!(table.starts_with("| second | admitted |\n|---:|---:|\n| 0–1 | 36 |\n"));
    let doc = std::fs::read_to_string("docs/bench/warmup.md").unwrap();
    assert!(
        doc.contains(table.trim_end()),
        "docs/bench/warmup.md is stale"
    );
    let svg = warmup_plot::svg(&warmup_plot::rates(&times));
    assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
}
