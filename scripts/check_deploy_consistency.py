#!/usr/bin/python3
"""Checks that the deployment assets agree with the server and with each other.

- pagoda-server's --help has exactly the flags of README.md's configuration table;
- every PAGODA_* variable and every --flag given to pagoda-server by the Dockerfile and
  the Kubernetes manifests is a flag of pagoda-server (its --help when a binary is given,
  else README.md's flag table), and the HEALTHCHECK's pagoda-cli usage exists;
- ports: named ports grpc/metrics, probes, EXPOSE and the listen addresses agree;
- terminationGracePeriodSeconds exceeds the drain timeout plus, with
  PAGODA_SNAPSHOT_DIR (a mounted volume), the snapshot of a full cache, and the
  liveness probe's failure window exceeds the drain (a draining server answers
  NOT_SERVING);
- every alert has a summary and a runbook_url anchor that docs/runbook.md has;
- every pagoda_* metric the alert rules and the dashboard use is built in
  server/observability/metrics.cc;
- the dashboard is valid JSON; its queries are written out as recording rules for
  `promtool check rules` to parse (--dashboard-rules FILE).

Uses Debian's python3 with PyYAML (a dependency of yamllint).
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
errors = []


def fail(message):
    errors.append(message)


def env_name(flag):
    return "PAGODA_" + flag[2:].upper().replace("-", "_")


def server_flags(server_binary, design_md):
    """Returns ({flag: env name}, where they came from)."""
    if server_binary:
        text = subprocess.run([server_binary, "--help"], capture_output=True, text=True,
                              timeout=30, check=True).stdout
        flags = {}
        for line in text.splitlines():
            m = re.match(r"\s+(?:-\w,)?(--[a-z0-9][a-z0-9-]*)\b(.*)", line)
            if not m or m.group(1) == "--help":
                continue
            env = re.search(r"\(Env:(PAGODA_[A-Z0-9_]+)\)", m.group(2))
            flags[m.group(1)] = env.group(1) if env else None
        return flags, f"{server_binary} --help"
    text = design_md.read_text()
    start = text.index("| flag | meaning | default |")
    flags = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        for flag in re.findall(r"`(--[a-z0-9-]+)`", line.split("|")[1]):
            flags[flag] = env_name(flag)
    return flags, f"the flag table of {design_md}"


def load_manifests(components=False):
    """The manifests by kind; with components, those under the component folders too (patches)."""
    docs = {}
    folder = ROOT / "deploy/kubernetes"
    for path in sorted(folder.rglob("*.yaml") if components else folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.setdefault(doc.get("kind"), []).append((path.name, doc))
    return docs


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def dockerfile_instructions(dockerfile):
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    lines = [l for l in dockerfile.splitlines() if not l.lstrip().startswith("#")]
    return [l.strip() for l in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines() if l.strip()]


def check_flags(flags, source, docs, dockerfile):
    known_env = {env or env_name(flag) for flag, env in flags.items()}
    used_env = {}   # name -> where
    used_flags = {}
    for name, kust in docs.get("Kustomization", []):
        for gen in kust.get("configMapGenerator", []):
            for literal in gen.get("literals", []):
                used_env.setdefault(literal.split("=", 1)[0], f"{name} configMapGenerator")
    for name, sts in docs.get("StatefulSet", []):
        for c in sts["spec"]["template"]["spec"].get("containers", []):  # a patch may have none
            for e in c.get("env", []):
                used_env.setdefault(e["name"], f"{name} env")
            for arg in c.get("args", []) + c.get("command", [])[1:]:
                if arg.startswith("--"):
                    used_flags.setdefault(arg.split("=", 1)[0], f"{name} args")
    # Build arguments (ARG PAGODA_CUDA) configure the build, not the server.
    build_args = {m.group(1) for line in dockerfile_instructions(dockerfile)
                  if (m := re.match(r"ARG\s+([A-Za-z0-9_]+)", line))}
    for line in dockerfile_instructions(dockerfile):
        for env in re.findall(r"\b(PAGODA_[A-Z0-9_]+)", line):
            if env not in build_args:
                used_env.setdefault(env, "Dockerfile")
        if re.match(r"(ENTRYPOINT|CMD)\b", line):
            for flag in re.findall(r"(--[a-z0-9][a-z0-9-]*)", line):
                used_flags.setdefault(flag, "Dockerfile " + line.split()[0])
    for env, where in sorted(used_env.items()):
        if env.startswith("PAGODA_") and env not in known_env:
            fail(f"{where}: {env} is no pagoda-server flag's variable in {source}")
    for flag, where in sorted(used_flags.items()):
        if flag not in flags:
            fail(f"{where}: {flag} is not a pagoda-server flag in {source}")
    return used_env


def check_cli(cli_binary, dockerfile):
    hc = next((l for l in dockerfile_instructions(dockerfile)
               if l.startswith("HEALTHCHECK") and "pagoda-cli" in l), None)
    if hc is None:
        fail("Dockerfile: no HEALTHCHECK through pagoda-cli")
        return
    if not cli_binary:
        return
    text = subprocess.run([cli_binary, "--help"], capture_output=True, text=True,
                          timeout=30, check=True).stdout
    for flag in re.findall(r"(--[a-z0-9][a-z0-9-]*)", hc.split("pagoda-cli", 1)[1]):
        if not re.search(rf"^\s+{re.escape(flag)}\b", text, re.M):
            fail(f"Dockerfile HEALTHCHECK: pagoda-cli has no option {flag}")
    if not re.search(r"^\s+health\s", text, re.M):
        fail("Dockerfile HEALTHCHECK: pagoda-cli has no 'health' subcommand")


# The write bandwidth a snapshot is sized with (bytes/s): 2/3 of a 0.9 GB/s
# local disk, the ratio to `dd conv=fsync` that docs/snapshot-format.md measured.
SNAPSHOT_WRITE_BYTES_PER_SECOND = 6e8


def check_ports_and_timing(docs, dockerfile):
    settings = {}
    for _, kust in docs.get("Kustomization", []):
        for gen in kust.get("configMapGenerator", []):
            settings.update(l.split("=", 1) for l in gen.get("literals", []))
    exposed = {int(p) for l in dockerfile_instructions(dockerfile) if l.startswith("EXPOSE")
               for p in l.split()[1:]}
    for name, sts in docs.get("StatefulSet", []):
        pod = sts["spec"]["template"]["spec"]
        c = next(c for c in pod["containers"] if c["name"] == "pagoda")
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        env = {**settings, **env}
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        if set(ports) != {"grpc", "metrics"}:
            fail(f"{name}: container ports must be named grpc and metrics, got {sorted(ports)}")
            continue
        if port_of(env.get("PAGODA_LISTEN", "0.0.0.0:50051")) != ports["grpc"]:
            fail(f"{name}: PAGODA_LISTEN does not listen on containerPort grpc ({ports['grpc']})")
        if port_of(env.get("PAGODA_METRICS_ADDRESS", "0.0.0.0:9464")) != ports["metrics"]:
            fail(f"{name}: PAGODA_METRICS_ADDRESS is not containerPort metrics ({ports['metrics']})")
        if exposed != set(ports.values()):
            fail(f"Dockerfile EXPOSE {sorted(exposed)} differs from the container ports {sorted(ports.values())}")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            grpc = c.get(probe, {}).get("grpc")
            if grpc is None:
                fail(f"{name}: {probe} must be a native gRPC probe")
            elif grpc.get("port") != ports["grpc"]:
                fail(f"{name}: {probe} probes port {grpc.get('port')}, not grpc ({ports['grpc']})")
        if c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") != 1:
            fail(f"{name}: the pagoda container must limit nvidia.com/gpu to 1")
        drain = float(env.get("PAGODA_DRAIN_TIMEOUT", 30))
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace <= drain:
            fail(f"{name}: terminationGracePeriodSeconds {grace} must exceed PAGODA_DRAIN_TIMEOUT {drain:g}")
        snapshot_dir = env.get("PAGODA_SNAPSHOT_DIR")
        if snapshot_dir:
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            if snapshot_dir not in mounts:
                fail(f"{name}: PAGODA_SNAPSHOT_DIR {snapshot_dir} is no volumeMount (the root filesystem is read-only)")
            write = float(env.get("PAGODA_CACHE_BYTES", 0)) / SNAPSHOT_WRITE_BYTES_PER_SECOND
            if grace <= drain + write:
                fail(f"{name}: terminationGracePeriodSeconds {grace} must exceed the drain ({drain:g} s) plus the "
                     f"snapshot of a full cache ({write:.0f} s at {SNAPSHOT_WRITE_BYTES_PER_SECOND / 1e9:g} GB/s)")
        live = c.get("livenessProbe", {})
        window = live.get("periodSeconds", 10) * live.get("failureThreshold", 3)
        if window <= drain:
            fail(f"{name}: livenessProbe fails after {window} s, within the {drain:g} s drain")
        if not pod.get("securityContext", {}).get("runAsNonRoot"):
            fail(f"{name}: pod securityContext must set runAsNonRoot")
    for kind in ("Service",):
        for name, svc in docs.get(kind, []):
            names = {p["name"] for p in svc["spec"]["ports"]}
            if names != {"grpc", "metrics"}:
                fail(f"{name}: Service ports must be named grpc and metrics, got {sorted(names)}")
    for name, sm in docs.get("ServiceMonitor", []):
        if [e.get("port") for e in sm["spec"]["endpoints"]] != ["metrics"]:
            fail(f"{name}: ServiceMonitor must scrape the port named metrics")


def check_alerts():
    """Every alert has a summary and a runbook_url whose anchor is a heading of the runbook."""
    rules = yaml.safe_load((ROOT / "deploy/prometheus/rules/pagoda-alerts.yml").read_text())
    runbook = (ROOT / "docs/runbook.md").read_text()
    # GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes.
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.*)$", runbook, re.M)}
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    for rule in alerts:
        notes = rule.get("annotations", {})
        if not notes.get("summary"):
            fail(f"alert {rule['alert']}: no summary")
        url = notes.get("runbook_url", "")
        if not url.startswith("docs/runbook.md#") or url.split("#", 1)[1] not in anchors:
            fail(f"alert {rule['alert']}: runbook_url {url!r} is no heading of docs/runbook.md")
    return len(alerts)


def metric_families():
    source = (ROOT / "server/observability/metrics.cc").read_text()
    return set(re.findall(r'"(pagoda_[a-z0-9_]+)"', source))


def used_metrics(text):
    names = set(re.findall(r"\b(pagoda_[a-z0-9_]+)", text))
    return {re.sub(r"_(bucket|count|sum)$", "", n) if n.endswith(("_bucket", "_count", "_sum"))
            and not n.endswith("_total") else n for n in names}


def dashboard_queries(path):
    try:
        dash = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        fail(f"{path.name}: not valid JSON: {e}")
        return []
    exprs = []

    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if "expr" in t)
            walk(p.get("panels", []))
    walk(dash.get("panels", []))
    if not exprs:
        fail(f"{path.name}: no queries")
    return exprs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server-binary")
    parser.add_argument("--cli-binary")
    parser.add_argument("--design", default=str(ROOT / "README.md"))
    parser.add_argument("--dashboard-rules", required=True,
                        help="where to write the dashboard's queries as a rule file")
    args = parser.parse_args()

    design = pathlib.Path(args.design)
    if not args.server_binary and not design.exists():
        print(f"check-deploy: neither a pagoda-server binary nor {design}", file=sys.stderr)
        return 1
    flags, source = server_flags(args.server_binary, design)
    if "--listen" not in flags:
        fail(f"no --listen flag read from {source}: is that the right binary or file?")
    if args.server_binary and design.exists():
        # README's table fixes the flag names deployments rely on: the binary must have
        # them all, and every flag the binary has must be documented there.
        design_flags, design_source = server_flags(None, design)
        for flag in sorted(set(design_flags) - set(flags)):
            fail(f"{source} lacks {flag}, a fixed flag of {design_source}")
        for flag in sorted(set(flags) - set(design_flags)):
            fail(f"{flag} of {source} is not documented in {design_source}")
    docs = load_manifests()
    dockerfile = (ROOT / "Dockerfile").read_text()
    used_env = check_flags(flags, source, load_manifests(components=True), dockerfile)
    check_cli(args.cli_binary, dockerfile)
    check_ports_and_timing(docs, dockerfile)

    num_alerts = check_alerts()
    families = metric_families()
    queries = dashboard_queries(ROOT / "deploy/grafana/pagoda-dashboard.json")
    rule_text = (ROOT / "deploy/prometheus/rules/pagoda-alerts.yml").read_text()
    for where, text in (("alert rules", rule_text), ("dashboard", "\n".join(queries))):
        for name in sorted(used_metrics(text) - families):
            fail(f"{where}: {name} is not a metric family built in server/observability/metrics.cc")

    # Grafana's variables replaced by plain values, each query as a recording rule.
    rules = [{"record": f"pagoda_dashboard:query{i}",
              "expr": re.sub(r"\$__(rate_interval|range|interval)", "5m", q).replace("$instance", ".*")}
             for i, q in enumerate(queries)]
    pathlib.Path(args.dashboard_rules).write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))

    for e in errors:
        print(f"check-deploy: {e}", file=sys.stderr)
    print(f"consistency: {len(used_env)} PAGODA_* variables and the ports checked against {source}; "
          f"{num_alerts} alerts' runbook anchors; {len(queries)} dashboard queries; {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
