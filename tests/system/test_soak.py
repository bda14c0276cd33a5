"""The chaos soak's short mode (tests/system/stress/soak.py): about a minute of fits, two at a
time and back to back, on one cluster whose workers and nannies are SIGKILLed and retired."""

from stress import soak


def test_fits_under_chaos_end_where_they_end_undisturbed(tmp_path):
    summary = soak.supervise(*_args(tmp_path))
    bad = "\n".join(summary.pop("bad lines"))
    assert summary["exit status"] == 0 and summary.get("fits", 0) >= 8, summary
    assert summary["lost"] == summary["hung"] == summary["off tolerance"] == 0, summary
    assert summary["worker kills"] + summary["nanny kills"] + summary["retirements"] >= 5, summary
    assert not bad, f"the soak's log has ERROR lines or tracebacks:\n{bad}"


def _args(tmp_path):
    argv = ["--minutes", "1", "--threads", "2", "--workloads", "4", "--seed", "1", "--log", str(tmp_path / "soak.log")]
    parser_args = soak.parse(argv)
    return parser_args, argv
