"""The chaos soak's short mode (tests/system/stress/soak.py): a minute of fits, two at a time
and back to back, on one growing cluster whose workers and nannies are SIGKILLed and retired;
every fit must end where it ends undisturbed, and the whole log (the workers' too) must have no
ERROR line and no traceback.  About 1.5-2 minutes on 2 cores."""

from stress import soak

SHORT = ["--minutes", "1", "--threads", "2", "--workloads", "4", "--seed", "1"]


def test_fits_under_chaos_end_where_they_end_undisturbed(tmp_path):
    argv = [*SHORT, "--log", str(tmp_path / "soak.log")]
    summary = soak.supervise(soak.parse(argv), argv)
    bad = "\n".join(summary.pop("bad lines"))
    assert summary["exit status"] == 0 and summary.get("fits", 0) >= 8, summary
    assert summary["lost"] == summary["hung"] == summary["off tolerance"] == 0, summary
    assert summary["worker kills"] + summary["nanny kills"] + summary["retirements"] >= 5, summary
    assert not bad, f"the soak's log has ERROR lines or tracebacks:\n{bad}"
