"""The official MCP conformance suite (`conformance server`) against the real API, from outside.

Each run targets the auth-adding loopback proxy (the suite sends no credentials) and pins
`--spec-version`, so the checks that run do not drift with the suite's default. The suite's exit code must
be 0 (it exits 1 on any FAILURE), and the exact set of checks it reports, with each one's status, must
match the table below — so a check that starts failing, disappears, or starts running (e.g. session
checks if the server ever issues session ids) turns the test red.

Our server is deliberately stateless and POST-only (no Mcp-Session-Id, GET /mcp -> 405). The suite
treats that as legitimate: the session-bound checks report INFO "not applicable" or a WARNING, not a
FAILURE. Those outcomes are pinned here with the reason; at spec 2026-07-28 (the stateless protocol) the
multiple-streams scenario really runs and passes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ANSI = re.compile(r"\x1b\[[0-9;]*m")
OK, INFO, WARNING = "SUCCESS", "INFO", "WARNING"


@dataclass(frozen=True)
class Case:
    scenario: str
    spec: str
    checks: dict[str, str]  # check id -> expected status, exactly the checks the suite reports
    why: str = ""           # why a non-SUCCESS status is the right outcome for this server

    @property
    def id(self) -> str:
        return f"{self.scenario}@{self.spec}"


CASES = [
    # --- 2025-11-25: the stateful-era wire (initialize handshake), what today's clients speak ---------
    Case("server-initialize", "2025-11-25",
         {"server-initialize": OK, "wire-schema-valid": OK, "server-session-id-visible-ascii": INFO},
         why="INFO 'Server did not provide an MCP-Session-Id header (session ID is optional)': stateless"),
    Case("ping", "2025-11-25", {"ping": OK, "wire-schema-valid": OK}),
    Case("tools-list", "2025-11-25", {"tools-list": OK, "tools-name-format": OK, "wire-schema-valid": OK}),
    Case("resources-list", "2025-11-25", {"resources-list": OK, "wire-schema-valid": OK}),
    Case("server-session-lifecycle", "2025-11-25", {"server-session-lifecycle-skipped": INFO},
         why="INFO 'Server did not return an MCP-Session-Id header; session lifecycle does not apply': "
             "stateless by design, so the DELETE/404 lifecycle checks do not run"),
    Case("server-sse-multiple-streams", "2025-11-25", {"server-sse-multiple-streams-session": WARNING},
         why="WARNING 'Server did not provide session ID - multiple streams test may not work correctly': "
             "at this spec version the scenario needs a session and stops there; see the 2026-07-28 case"),
    Case("dns-rebinding-protection", "2025-11-25",
         {"localhost-host-rebinding-rejected": OK, "localhost-host-valid-accepted": OK}),
    # --- 2026-07-28: the stateless wire (per-request _meta); scenarios that apply there ---------------
    # (server-initialize, ping and server-session-lifecycle are removed in 2026-07-28: the suite skips.)
    Case("tools-list", "2026-07-28", {"tools-list": OK, "tools-name-format": OK,
                                      "tools-list-deterministic-order": OK, "wire-schema-valid": OK}),
    Case("resources-list", "2026-07-28", {"resources-list": OK, "wire-schema-valid": OK}),
    Case("server-sse-multiple-streams", "2026-07-28",
         {"server-accepts-multiple-post-streams": OK, "server-sse-streams-functional": INFO},
         why="INFO 'Server returned JSON for all requests - SSE streaming is optional': json_response=True"),
    Case("dns-rebinding-protection", "2026-07-28",
         {"localhost-host-rebinding-rejected": OK, "localhost-host-valid-accepted": OK}),
]


@dataclass(frozen=True)
class SuiteRun:
    returncode: int
    output: str              # stdout + stderr, colours stripped
    checks: list[dict]       # the suite's checks.json

    def statuses(self) -> dict[str, str]:
        return {c["id"]: c["status"] for c in self.checks}

    def explain(self) -> str:
        bad = [{k: c.get(k) for k in ("id", "status", "errorMessage", "details")}
               for c in self.checks if c["status"] != OK]
        listed = json.dumps(bad, indent=2, default=str)[:6000]
        return f"non-SUCCESS checks:\n{listed}\n--- suite output ---\n{self.output[-4000:]}"


def run_suite(mcp_js, url: str, scenario: str, spec: str, out_dir: Path) -> SuiteRun:
    cmd = [str(mcp_js.node), str(mcp_js.conformance), "server", "--url", url, "--scenario", scenario,
           "--spec-version", spec, "--timeout", "30000", "-o", str(out_dir)]
    env = dict(os.environ, NO_COLOR="1", FORCE_COLOR="0")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=out_dir.parent, env=env)
    output = ANSI.sub("", proc.stdout + proc.stderr)
    results = sorted(out_dir.glob("*/checks.json"))
    assert "SKIPPED: scenario" not in output, f"the suite did not run {scenario} at {spec}:\n{output}"
    assert len(results) == 1, f"expected one checks.json under {out_dir}, got {results}\n{output}"
    return SuiteRun(proc.returncode, output, json.loads(results[0].read_text()))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_conformance_scenario(mcp_js, mcp_server, tmp_path, case: Case):
    seen = len(mcp_server.proxy.exchanges)
    run = run_suite(mcp_js, mcp_server.proxy_mcp_url, case.scenario, case.spec, tmp_path / "results")
    traffic = mcp_server.proxy.describe()

    assert run.returncode == 0, f"conformance {case.id} failed (rc={run.returncode})\n{run.explain()}\n" \
                                f"--- last exchanges through the proxy ---\n{traffic}"
    assert not [c for c in run.checks if c["status"] == "FAILURE"], run.explain()
    assert run.statuses() == case.checks, f"{case.id}: checks changed ({case.why})\n{run.explain()}"

    if case.scenario == "dns-rebinding-protection":
        # The rejection must come from the API's Host/Origin check, not from a missing token: the proxy
        # passed the forged Host through unchanged and the SDK's transport security answered 421.
        forged = [ex for ex in mcp_server.proxy.exchanges[seen:]
                  if ex.request_headers.get("host") == "evil.example.com"]
        assert forged, f"no request with the forged Host reached the proxy\n{traffic}"
        assert all(ex.status == 421 and b"Invalid Host header" in ex.response_body for ex in forged), traffic
