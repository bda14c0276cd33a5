"""The benchmark report (benchmarks/run.py) from synthetic records: ratios, pairing and bars."""

from benchmarks.run import paired_ratio, tables


def _rec(workload, peer, repeat, sps, loss=1.0):
    return {"workload": workload, "peer": peer, "repeat": repeat, "samples_per_s": sps, "updates_per_s": sps / 512,
            "final_loss": loss, "train_s": 1.0, "peak_rss_mb": 100.0}


def test_paired_ratio_pairs_by_repeat():
    plain = [_rec("W1", "plain", 0, 100.0), _rec("W1", "plain", 1, 50.0), _rec("W1", "plain", 2, 80.0)]
    peer = [_rec("W1", "x", 0, 80.0), _rec("W1", "x", 1, 45.0), _rec("W1", "x", 2, 60.0)]
    assert paired_ratio(peer, plain) == 0.8  # median of 0.8, 0.9, 0.75
    assert paired_ratio(peer, []) is None


def test_report_shows_both_ratios_and_the_plain_bar():
    # A machine slowing down between repeats: the ratio of medians and the paired ratio differ.
    records = [
        _rec("W1", "plain", 0, 100.0), _rec("W1", "adadamp", 0, 68.0),
        _rec("W1", "plain", 1, 60.0), _rec("W1", "adadamp", 1, 45.0),
        _rec("W1", "plain", 2, 90.0), _rec("W1", "adadamp", 2, 70.0),
    ]
    for r in records:
        if r["peer"] == "adadamp":
            r.update(setup_s=1.0, breakdown={k: 0.001 for k in ("compute", "comm", "aggregate", "step", "update",
                                                                 "overhead", "other")})
    text = tables(records, quick=False)
    row = next(line for line in text.splitlines() if line.startswith("| W1 | adadamp |"))
    cells = [c.strip() for c in row.split("|")]
    assert cells[5] == "0.76" and cells[6] == "0.75"  # medians 68/90; median of 0.68, 0.75, 0.78
    assert "| W1: adadamp samples/s >= 0.7x plain | 0.76x | PASS |" in text
