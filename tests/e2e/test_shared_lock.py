"""Two CronJobs that share one lock never run at the same time, however the runs race."""

from __future__ import annotations

from tests.e2e.scenario import UNTIL_FINISHED, Scenario
from tests.support.contract import EXIT_SKIPPED
from tests.support.kube import wait_for
from tests.support.node import overlapping

RUNS = 10


def test_two_cronjobs_sharing_a_lock_never_overlap_over_many_runs(cluster: Scenario) -> None:
    for name in ("export-a", "export-b"):
        # Each names the other: whichever is guarded first, the second may join its lock.
        # A work holds until the test ends it, once every run racing it has decided.
        cluster.cronjob(
            name,
            f"echo exporting; {UNTIL_FINISHED}",
            lock="exports",
            share_lock_with="export-a,export-b",
        )
    jobs = [f"export-{'ab'[i % 2]}-{i}" for i in range(RUNS)]

    def decide_then_finish(batch: list[str]) -> None:
        """Wait until every run of `batch` has decided, then end the works of those that
        ran and wait for the lock to be given back."""
        codes = {job: cluster.gate_exit(job, timeout=90) for job in batch}
        for job, code in codes.items():
            if code == 0:
                cluster.finish(cluster.main_running(job))
        wait_for(
            lambda: not cluster.lease("exports")["spec"].get("holderIdentity"),
            60,
            "the lock given back",
        )

    # Four at once (their sidecars race for the Lease; the winner holds until all four
    # decided, so the others find it held), then one at a time on the free lock.
    for job in jobs[:4]:
        cluster.run(job.rsplit("-", 1)[0], job)
    decide_then_finish(jobs[:4])
    for job in jobs[4:]:
        cluster.run(job.rsplit("-", 1)[0], job)
        decide_then_finish([job])

    decisions = {job: cluster.gate_exit(job, timeout=90) for job in jobs}
    ran = [job for job, code in decisions.items() if code == 0]
    assert set(decisions.values()) <= {0, EXIT_SKIPPED}, decisions
    # The first four raced: exactly one won and held until the other three had decided.
    assert [decisions[job] for job in jobs[:4]].count(0) == 1, decisions
    # Each later run started on the lock its predecessor had given back.
    assert all(decisions[job] == 0 for job in jobs[4:]), decisions
    for job in ran:
        assert cluster.main_finished(job, timeout=90) == 0
    works = cluster.namespace_works()
    assert sorted(work.pod.rsplit("-", 1)[0] for work in works) == sorted(ran)
    assert overlapping(works) == [], "two runs of one lock worked at the same time"
    assert {job for job in cluster.jobs_seen() if job} == set(jobs)
    lease = cluster.lease("exports")
    owners = sorted(owner["name"] for owner in lease["metadata"]["ownerReferences"])
    assert owners == ["export-a", "export-b"]
    skipped = RUNS - len(ran)

    def skip_events() -> list[tuple[str, str]]:
        return cluster.events("export-a", "Skipped") + cluster.events("export-b", "Skipped")

    try:
        wait_for(lambda: len(skip_events()) >= skipped, 60, "a Skipped Event for every skipped run")
    except AssertionError as error:
        raise AssertionError(f"{error}: decisions {decisions}, Events {skip_events()}") from None
    messages = sorted(message for _, message in skip_events())
    assert len(messages) == skipped, (decisions, messages)
