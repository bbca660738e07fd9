"""``flextrain status``, ``stop``, ``scale``, ``suspend`` and ``resume`` of a local job.

A local job is found by its directory (or its name under ./flextrain-jobs);
status reads its status.json, stop and scale call its master over gRPC.
flextrain.cli.kubernetes adds the flags that send these commands to an
ElasticJob instead.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from flextrain.cli.common import CLIError, job_file_candidates, none_exist


def add_commands(sub) -> None:
    """The ``status``, ``stop``, ``scale``, ``suspend`` and ``resume`` subcommands."""
    for name, fn, help_ in (("status", cmd_status, "show a job's status"),
                            ("stop", cmd_stop, "stop a running job"),
                            ("scale", cmd_scale, "change the number of workers of a running job"),
                            ("suspend", cmd_suspend, "checkpoint a running job and release all its workers"),
                            ("resume", cmd_resume, "launch the workers of a suspended job again")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("job", metavar="JOB", help="job name or job directory")
        if name == "status":
            p.add_argument("--json", action="store_true", help="print status.json")
            p.add_argument("--watch", action="store_true",
                           help="refresh the summary every second until the job ends (Ctrl-C leaves)")
        if name == "stop":
            p.add_argument("--reason", default="stopped by user (flextrain stop)",
                           help="recorded as the job's final message")
        if name in ("suspend", "resume"):
            p.add_argument("--reason", default=f"{name.removesuffix('e')}ed by user (flextrain {name})",
                           help="recorded in the job's events")
        if name == "scale":
            p.add_argument("workers", type=int, metavar="N",
                           help="the number of workers wanted, within the job's --min-workers..--max-workers")
        p.set_defaults(fn=fn)


def _job_dir(job: str) -> Path:
    candidates = job_file_candidates(job, "status.json")
    for candidate in candidates:
        if candidate.is_file():
            return candidate.parent
    raise CLIError(f"no job {job!r}: {none_exist(candidates)}")


def _read_status(job: str, *, complete: bool = True) -> dict:
    """status.json of a local job; ``complete``: with every field `flextrain status` prints (else
    stop and scale need only an object with the master's address)."""
    from flextrain.master.status import check_status

    path = _job_dir(job) / "status.json"
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or complete:
            check_status(data, path)
        return data
    except (OSError, ValueError) as exc:
        raise CLIError(f"cannot read {path}: {exc}" if not str(exc).startswith(str(path)) else str(exc)) from exc


def _master_alive(status: dict) -> bool:
    pid = status.get("pid")
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _call_master(status: dict, rpc: str, request, *, hint: str = ""):
    """``rpc`` of the job's running master with ``request``; ``hint``: what to do instead when it is not running.

    A --tls job (status.json's ``tls``: the job says so, not which files exist) is dialled with the CA and
    token in ``<jobDir>/tls/`` and nothing else; a file missing or broken, the token refused, a failed
    handshake or any other failed call is a CLIError of one line naming the file or the problem."""
    import grpc

    from flextrain.proto import flextrain_pb2_grpc as pb_grpc
    from flextrain.protocol.limits import MASTER_MESSAGE_OPTIONS
    from flextrain.protocol.security import CredentialsError, open_channel, read_credentials

    name, address = status.get("name"), status.get("masterAddress")
    if status.get("phase") in ("Succeeded", "Failed") or not _master_alive(status):
        raise CLIError(f"job {name} is not running (phase {status.get('phase')}){hint}")
    if not isinstance(address, str):
        raise CLIError(f"job {name}: its status.json names no master address (masterAddress)")
    tls_dir, creds = Path(str(status.get("jobDir"))) / "tls", None
    if status.get("tls"):  # never plaintext with the token: that would send it in the clear
        try:
            creds = read_credentials(tls_dir)
        except CredentialsError as exc:
            raise CLIError(f"job {name} runs with --tls: {exc}") from exc
    try:
        with open_channel(address, creds, options=MASTER_MESSAGE_OPTIONS) as channel:
            return getattr(pb_grpc.MasterStub(channel), rpc)(request, timeout=10)
    except grpc.RpcError as exc:
        raise CLIError(_call_problem(exc, name, address, rpc, tls_dir if creds else None)) from exc


def _call_problem(exc, name, address: str, rpc: str, tls_dir: Path | None) -> str:
    """One line saying why ``rpc`` to job ``name``'s master failed (``tls_dir``: the material it was dialled
    with)."""
    import grpc

    code, details = exc.code(), (exc.details() or "").strip()
    if tls_dir is not None and code is grpc.StatusCode.UNAUTHENTICATED:
        return (f"job {name}'s master refused the token in {tls_dir / 'token'}: the credentials in {tls_dir} "
                f"don't match this job's")
    if tls_dir is not None and code is grpc.StatusCode.UNAVAILABLE and any(
            word in details.lower() for word in ("handshake", "ssl", "tsi_", "certificate")):
        return (f"no TLS connection to job {name}'s master at {address}: the handshake failed; is "
                f"{tls_dir / 'ca.crt'} this job's CA? ({details.splitlines()[0] if details else code.name})")
    return f"job {name}'s master at {address} did not answer {rpc}: {code.name}: {' '.join(details.split())}"


def _current_status(job: str) -> dict:
    """status.json, its message saying so when the master that wrote it is gone (and without the metrics
    URL that master served: nothing answers there any more)."""
    status = _read_status(job)
    if status.get("phase") in ("Pending", "Running", "Suspended") and not _master_alive(status):
        status["message"] = f"master process {status.get('pid')} is gone; status is from its last write"
        status.pop("metricsUrl", None)
    return status


def _wait_for_job(job: str, *, interval: float) -> bool:
    """``status --watch`` started with the job (``flextrain train`` writes status.json only after its
    checks): wait for the file, saying so once. False: Ctrl-C while waiting."""
    candidates = job_file_candidates(job, "status.json")
    if any(c.is_file() for c in candidates):
        return True
    print(f"waiting for {' or '.join(map(str, candidates))} (Ctrl-C leaves) ...", file=sys.stderr, flush=True)
    try:
        while not any(c.is_file() for c in candidates):
            time.sleep(interval)  # polling the file system at the refresh period: no process to wait on
    except KeyboardInterrupt:
        return False
    return True


def cmd_status(args) -> int:
    if getattr(args, "watch", False):
        from flextrain.cli.watch import INTERVAL, OVER, watch

        if not _wait_for_job(args.job, interval=INTERVAL):
            return 0

        def read() -> tuple[list[str], bool]:  # over: the job ended, or its master is gone
            status = _current_status(args.job)
            return status_lines(status), status["phase"] in OVER or not _master_alive(status)

        return watch(read)
    status = _current_status(args.job)
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return 0
    print("\n".join(status_lines(status)))
    return 0


def status_lines(status: dict) -> list[str]:
    """The readable summary of a local job's status.json, a line each."""
    from flextrain.master.failures import failure_lines

    p, w = status["progress"], status["workers"]
    lines = [f"job       {status['name']}  ({status['jobDir']})",
             f"phase     {status['phase']}" + (f"  - {status['message']}" if status.get("message") else ""),
             f"workers   {w['active']} active / {w['desired']} desired"]
    if spares := status.get("spares"):  # --spare-workers: started ahead, not workers
        lines.append(f"spares    {spares['parked']} parked, {spares['starting']} starting / {spares['desired']} "
                     f"wanted ({spares['taken']} taken so far)")
    if p["recordsTotal"]:
        lines.append(f"epoch     {status['epoch']}/{status['epochs']}   step {status['step']}")
        lines.append(f"progress  {p['recordsDone']:,}/{p['recordsTotal']:,} records ({p['percent']}%)")
    else:  # a script job: its own data, no epochs or total known to flextrain
        lines.append(f"step      {status['step']}")
        lines.append(f"progress  {p['recordsDone']:,} samples trained")
    if accelerate := status.get("accelerate"):  # --accelerate: the training strategy, and how it was chosen
        lines.append(f"strategy  {accelerate.get('strategy') or 'not chosen yet'}  ({accelerate.get('source')})")
    lines += result_lines(status)
    if evaluations := status.get("evaluations"):  # the metrics above are the latest evaluation's
        more = f" (of {len(evaluations)} evaluations)" if len(evaluations) > 1 else ""
        lines.append(f"evaluated at step {evaluations[-1]['step']} on {evaluations[-1]['samples']:,} samples{more}")
    if status.get("metricsUrl") and status["phase"] in ("Pending", "Running", "Suspended"):
        lines.append(f"metrics   {status['metricsUrl']}")
    return lines + failure_lines(status.get("failure"))


def result_lines(status: dict) -> list[str]:
    """The metrics, and a prediction job's output, a line each (of status.json or an ElasticJob's status)."""
    lines = metric_lines(status.get("metrics") or {})
    prediction = status.get("prediction") or {}
    if prediction.get("output"):
        records = prediction.get("records")
        lines.append(f"output    {records:,} predictions in {prediction['output']}" if records is not None
                     else f"output    {prediction['output']} (predictions being written)")
    return lines


def metric_lines(metrics: dict) -> list[str]:
    """A line per metric ("nan" and other strings as they are)."""
    return [f"{name:<9} {value:.4f}" if not isinstance(value, str) else f"{name:<9} {value}"
            for name, value in sorted(metrics.items())]


def cmd_stop(args) -> int:
    from flextrain.proto import flextrain_pb2 as pb

    status = _read_status(args.job, complete=False)
    resp = _call_master(status, "Stop", pb.StopRequest(reason=args.reason))
    print(resp.message)
    return 0 if resp.accepted else 1


def cmd_suspend(args) -> int:
    return _suspend(args, suspend=True)


def cmd_resume(args) -> int:
    return _suspend(args, suspend=False)


def _suspend(args, *, suspend: bool) -> int:
    """Suspend or resume through the master (flextrain/master/suspension.py); a refusal is the error."""
    from flextrain.proto import flextrain_pb2 as pb

    status = _read_status(args.job, complete=False)
    # `flextrain resume` lets a suspended job's running master go on; a job whose master ended (stopped,
    # failed, finished) is continued by a new run from its checkpoint
    hint = "" if suspend else (f"; `flextrain resume` continues a suspended job: to continue this one from its "
                               f"latest checkpoint, run `flextrain train --resume {status.get('jobDir') or args.job}`")
    resp = _call_master(status, "Suspend", pb.SuspendRequest(suspend=suspend, reason=args.reason), hint=hint)
    if not resp.accepted:
        raise CLIError(resp.message)
    print(resp.message)
    return 0


def cmd_scale(args) -> int:
    from flextrain.proto import flextrain_pb2 as pb

    status = _read_status(args.job, complete=False)
    resp = _call_master(status, "Scale", pb.ScaleRequest(workers=args.workers))
    if not resp.accepted:  # printed once, by main(), as the error
        raise CLIError(resp.message)
    print(resp.message)
    return 0
