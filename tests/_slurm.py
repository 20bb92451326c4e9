"""A real one-node Slurm cluster for tests: munged, slurmctld and slurmd from Debian's packages
(`apt-get install slurm-wlm munge`), started on 127.0.0.1 with a slurm.conf and a munge key written
into a temporary directory, and killed at the end. Nothing of the machine's own configuration
(/etc/slurm, /etc/munge, /run/munge) is read or changed: every path and port is the test's own.

Used by tests/test_slurm.py (the session fixture) and runnable by hand for a look around:
`python tests/_slurm.py` starts the cluster, prints the SLURM_CONF to export and waits for Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sinfo", "scontrol", "squeue", "scancel")
# The one place the tests read a Slurm command's output through: every call is bounded.
CLIENT_TIMEOUT_S = 30.0
# The empty Prolog: the prolog tests write theirs and put this one back.
NO_PROLOG = "#!/bin/sh\nexit 0\n"


class SlurmUnavailable(Exception):
    """Why this machine cannot run the test cluster (the fixture skips with it)."""


def find_binary(name: str) -> Optional[str]:
    # Debian installs the daemons in /usr/sbin, which is not on every PATH.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slurm_conf(root: Path, host: str, cpus: int, munge_socket: Path, ports: tuple[int, int]) -> str:
    """A one-node, CPU-only slurm.conf: no cgroups, no accounting, every state path under `root`."""
    return "\n".join(
        [
            "ClusterName=ddpdoctortest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ports[0]}",
            f"SlurmdPort={ports[1]}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={munge_socket}",
            "CredType=cred/munge",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # Processes tracked by parent pid: no cgroup needed (a container has none to delegate).
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=5",
            "PrologEpilogTimeout=120",
            f"Prolog={root / 'prolog.sh'}",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


class SlurmCluster:
    """munged + slurmctld + slurmd, each in its own session, all SIGKILLed by stop()."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.conf = root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        # Variables of an enclosing allocation would make our srun join someone else's job.
        for name in list(self.env):
            if name.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_")) and name != "SLURM_CONF":
                del self.env[name]

    @property
    def prolog(self) -> Path:
        return self.root / "prolog.sh"

    def start(self, ready_s: float = 60.0) -> None:
        if os.geteuid() != 0:
            raise SlurmUnavailable("the test cluster runs slurmd as root (SlurmdUser=root); not root here")
        missing = [n for n in DAEMONS + CLIENTS if find_binary(n) is None]
        if missing:
            raise SlurmUnavailable(
                f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge; .ci/run does it)"
            )
        for d in ("state", "spool", "munge"):
            (self.root / d).mkdir(mode=0o700, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = self.root / "munge" / "munge.socket"
        self.write_prolog(NO_PROLOG)
        self.conf.write_text(
            slurm_conf(self.root, self.host, os.cpu_count() or 1, sock, (free_port(), free_port()))
        )
        munge_dir = self.root / "munge"
        self._spawn(
            [find_binary("munged") or "munged", "--foreground", "--force", f"--key-file={key}",
             f"--socket={sock}", f"--pid-file={munge_dir / 'munged.pid'}",
             f"--log-file={munge_dir / 'munged.log'}", f"--seed-file={munge_dir / 'munged.seed'}"],
            "munged",
        )  # fmt: skip
        self._wait(lambda: sock.exists(), 15.0, "munged did not open its socket")
        # -i: ignore any saved state; -D: stay in the foreground, so the Popen is the daemon.
        self._spawn([find_binary("slurmctld") or "slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._spawn(
            [find_binary("slurmd") or "slurmd", "-D", "-f", str(self.conf), "-N", self.host], "slurmd"
        )
        self._wait(self.node_idle, ready_s, "the node did not become idle")

    def _spawn(self, argv: list[str], name: str) -> None:
        log = open(self.root / f"{name}.out", "wb")
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise SlurmUnavailable(f"{name} did not start: {exc}") from None
        finally:
            log.close()
        self.procs.append(proc)

    def _wait(self, ready: object, limit_s: float, what: str) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise SlurmUnavailable(
                        f"{Path(proc.args[0]).name} exited with {proc.returncode}: {self.logs()}"
                    )
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.3)
        raise SlurmUnavailable(f"{what} within {limit_s:g}s: {self.logs()}")

    def logs(self, tail: int = 1500) -> str:
        out = []
        for name in (
            "munged.out",
            "munge/munged.log",
            "slurmctld.out",
            "slurmctld.log",
            "slurmd.out",
            "slurmd.log",
        ):
            path = self.root / name
            if path.exists():
                out.append(f"--- {name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    def run(
        self, *argv: str, timeout: float = CLIENT_TIMEOUT_S, **kwargs: object
    ) -> subprocess.CompletedProcess:
        """A Slurm client command (or anything else) with this cluster's SLURM_CONF, bounded."""
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, env=kwargs.pop("env", self.env),
            **kwargs,  # type: ignore[arg-type]
        )  # fmt: skip

    def node_state(self) -> str:
        """`sinfo`'s state of the node (idle, alloc, drain, ...), '' when it cannot answer."""
        try:
            out = self.run("sinfo", "-h", "-N", "-n", self.host, "-o", "%T", timeout=10)
        except subprocess.TimeoutExpired:
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    def node_idle(self) -> bool:
        return self.node_state() == "idle"

    def show_node(self) -> dict[str, str]:
        """`scontrol show node` as KEY=VALUE pairs (Reason's value runs to the end of its line)."""
        out = self.run("scontrol", "show", "node", self.host)
        fields: dict[str, str] = {}
        for line in out.stdout.splitlines():
            line = line.strip()
            if line.startswith("Reason="):
                fields["Reason"] = line[len("Reason=") :]
                continue
            for pair in line.split():
                key, sep, value = pair.partition("=")
                if sep:
                    fields[key] = value
        return fields

    def resume(self) -> None:
        """Undrain the node (the admin's act, done by the fixture after a drain test) and wait for idle."""
        self.run("scontrol", "update", f"nodename={self.host}", "state=resume")
        self._wait(self.node_idle, 30.0, "the node did not return to idle after resume")

    def write_prolog(self, text: str) -> None:
        tmp = self.prolog.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, self.prolog)

    def stop(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        # slurmstepd processes outlive slurmd by design (they re-attach after a restart): kill ours.
        self._kill_stepds()

    def _kill_stepds(self) -> None:
        import psutil

        spool = str(self.root / "spool")
        for proc in psutil.process_iter(["name", "cmdline", "environ"]):
            try:
                if proc.info["name"] != "slurmstepd":
                    continue
                env = proc.info.get("environ") or {}
                if env.get("SLURM_CONF") == str(self.conf) or spool in " ".join(proc.info["cmdline"] or []):
                    for child in proc.children(recursive=True):
                        child.kill()
                    proc.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue


if __name__ == "__main__":
    import tempfile

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM too: the daemons must not outlive this process

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # a background job starts with SIGINT ignored
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-slurm-") as tmp:
        cluster = SlurmCluster(Path(tmp))
        try:
            cluster.start()
            print(f"export SLURM_CONF={cluster.conf}", flush=True)
            signal.pause()
        except SlurmUnavailable as exc:
            print(f"unavailable: {exc}", file=sys.stderr)
        except KeyboardInterrupt:
            pass
        finally:
            cluster.stop()
