"""The one home of what the test rings, the reliability checkers, the benchmarks and the demo
share; each of them imports its helpers from here, never from another ring.

- `controlplane`: the one control-plane handle (`ControlPlane`, `started()`) and
  ServiceAccount kubeconfigs.
- `node`: the real node (`RealNode` and its faults) and what ran on it (`WorkTracker`,
  `PodRecorder`, `LeaseRecorder`).
- `operator`: the real `cronlock-operator` as a process (`OperatorProcess`) under the
  chart's RBAC, and the chart rendered (`render_chart`, `install_chart_rbac`).
- `kube`: small helpers for a real cluster (`wait_for`, `run_tool`, `finish_pod`).
- `fakekube`: an in-memory API server for the operator runtime's unit tests (`FakeKube`).
- `objects`: reading and nudging CronJobs on a real API server.
- `gen` and `leases`: the objects tests build, one builder per kind: CronJobs as users
  write them, Jobs and pods (`gen.cronjob(name, *modifiers)`, `gen.job`, `gen.pod`), and
  Leases written by the code's own lock model (`make_lease`).
- `cronjobs`: what the API server does to a CronJob (`server_defaults`), the Jobs made
  from one, and the operator settings tests inject with.
- `contract`: the published names and exit codes as literals, for assertions.
- `tools`: the Go tools built from pinned modules (`gotool`).
"""
