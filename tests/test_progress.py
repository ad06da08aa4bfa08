"""Long steps: their output streams to the stage's log as it comes, `p2pkit logs STAGE --follow`
shows it while the run holds the lock, and the step says its elapsed time."""

import sys
import threading
import time

from p2pkit.core.output import Output, elapsed
from p2pkit.core.runner import Runner


def test_output_reaches_the_log_while_the_command_runs(tmp_path):
    log = tmp_path / "logs/engine-build.log"
    log.parent.mkdir()  # the logs directory is the state directory's, which p2pkit makes (the runner makes none)
    seen = {}

    def watch():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "first" not in seen:
            if log.is_file() and "configure done" in log.read_text():
                seen["first"] = time.monotonic()
            time.sleep(0.05)

    t = threading.Thread(target=watch)
    t.start()
    r = Runner().run([sys.executable, "-c", "import sys, time; print('configure done', flush=True); "
                      "print('warning: x', file=sys.stderr, flush=True); time.sleep(2); print('built')"],
                     output_log=log)
    ended = time.monotonic()
    t.join()
    assert ended - seen["first"] > 1, "the first line reached the log only when the command ended"
    text = log.read_text()
    assert text.startswith(f"$ {sys.executable} -c ") and "configure done" in text and "warning: x" in text
    assert r.stdout == "configure done\nbuilt\n"  # still captured for the checks


def test_a_long_step_says_its_elapsed_time(capsys, monkeypatch):
    import p2pkit.core.output as output

    monkeypatch.setattr(output, "HEARTBEAT_S", 0.2)
    out = Output()
    with out.working("[engine] cmake --build", log="/var/lib/p2pkit/logs/x.log", follow="p2pkit logs engine --follow"):
        time.sleep(5.3)
    err = capsys.readouterr().err
    assert "[engine] cmake --build (output: /var/lib/p2pkit/logs/x.log; follow it with `p2pkit logs engine --follow`)" \
        in err
    assert "still running, " in err and "[engine] cmake --build: 5." in err
    assert elapsed(75) == "1m15s" and elapsed(3725) == "1h02m05s"


def test_logs_follow_prints_until_the_run_ends(cli, sim):
    from p2pkit.core.lock import state_lock

    root = sim("healthy")
    state = root / "var/lib/p2pkit"
    r = cli("--root", str(root), "logs", "driver")
    assert r.code == 2 and "no log for driver yet" in r.err and f"`p2pkit --root {root} up --to driver`" in r.err
    log = state / "logs/driver.log"
    log.parent.mkdir(parents=True)
    log.write_text("PLAY [Ensure the pinned NVIDIA userspace driver]\n")
    held = threading.Event()

    def a_run():  # a run holds the lock and writes its log for a while
        with state_lock(state):
            held.set()
            for i in range(3):
                time.sleep(0.6)
                with open(log, "a") as fh:
                    fh.write(f"TASK [step {i}]\n")

    t = threading.Thread(target=a_run)
    t.start()
    held.wait(10)
    r = cli("--root", str(root), "logs", "driver", "--follow")
    t.join()
    assert r.code == 0 and r.out == "PLAY [Ensure the pinned NVIDIA userspace driver]\n" + "".join(
        f"TASK [step {i}]\n" for i in range(3))
    assert cli("--root", str(root), "logs", "driver", "-n", "1").out == "TASK [step 2]\n"
