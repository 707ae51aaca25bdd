#!/usr/bin/env python3
"""deploy_check.py SOURCE_ROOT - check the deployment files against the code.

- Every YAML file under deploy/ parses.
- Kubernetes manifests (deploy/k8s/): apiVersion, kind and metadata.name on
  every object; selectors match their pod templates; Services point at
  workloads and named ports; the StatefulSet's Service is headless; volumes
  name claims and secrets that exist; the server's liveness probe is GET
  /healthz and its readiness probe GET /readyz on the port of PIPETRAIN_HTTP;
  workers' probes open the port of PIPETRAIN_LISTEN; workers request no
  nvidia.com/gpu (their stages run on their CPUs: a job on a CUDA device is
  not placed on workers, so a GPU would sit idle and hold the pod Pending
  where none is free).
- systemd units set neither PrivateDevices= nor ProtectClock= nor
  DeviceAllow= nor DevicePolicy=closed|strict (each closes the device policy
  and hides /dev/nvidia*).
- docker-compose.yml: a server and two or more workers, secrets and volumes
  defined; the servers' PIPETRAIN_POOL names the compose and Kubernetes
  workers (host names, ports, counts); the shipped job files name no workers
  and fit the pool.
- Dockerfile: multi-stage, CUDA devel -> runtime of one version, the build
  stage runs deploy/install-deps.sh, deploy/build.sh and deploy/stage.sh,
  non-root USER, HEALTHCHECK, VOLUME of the data directory, ENTRYPOINT
  pipeserver.
- systemd units that run pipeserver set LimitNOFILE, leaving at least 16
  API connections after the descriptors kept for jobs (server/main.c), and
  no PIPETRAIN_MAX_CONNECTIONS beyond that; the Kubernetes server manifest
  says what RLIMIT_NOFILE the runtime gives (there is no ulimit field).
- Drift: every PIPETRAIN_* name in Dockerfile, deploy/ and the READMEs is an
  option of server/config.c's table or a getenv() of our C sources, and
  every --flag given to pipeserver (pipeclient) is in its option table.
A server listening beyond loopback must name a token file.
Exit 0 ok, 1 with a list of problems, 77 (skip) without PyYAML.
"""
import glob
import json
import os
import re
import sys

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML is not importable (Debian: python3-yaml)")
    sys.exit(77)

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
problems = []


def rel(path):
    return os.path.relpath(path, ROOT)


def bad(path, msg):
    problems.append(f"{rel(path)}: {msg}")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# ---- what the code defines ------------------------------------------------

def server_options():
    text = read(os.path.join(ROOT, "server/config.c"))
    start = text.index("static const opt_desc options[]")
    table = text[start:text.index("\n};", start)]
    names = re.findall(r'\{"([a-z_]+)",\s*OPT_[A-Z]+', table)
    if "listen" not in names or "http" not in names or len(names) < 10:
        sys.exit(f"deploy_check: cannot read the option table of server/config.c ({names})")
    return names


def client_flags():
    text = read(os.path.join(ROOT, "client/pipeclient_cli.c"))
    flags = set(re.findall(r'\{"([a-z-]+)",\s*(?:required|no|optional)_argument', text))
    if "server" not in flags or "token" not in flags:
        sys.exit("deploy_check: cannot read pipeclient's long options")
    return {"--" + f for f in flags}


def c_sources():
    for path in glob.glob(os.path.join(ROOT, "**/*.c"), recursive=True):
        top = rel(path).split(os.sep)[0]
        if not top.startswith("build") and not top.startswith("."):
            yield path


OPTIONS = server_options()
SERVER_FLAGS = {"--" + n.replace("_", "-") for n in OPTIONS}
CLIENT_FLAGS = client_flags()
ENV_KNOWN = {"PIPETRAIN_" + n.upper() for n in OPTIONS}
for src in c_sources():
    ENV_KNOWN |= set(re.findall(r'getenv\("(PIPETRAIN_[A-Z0-9_]+)"\)', read(src)))


# ---- drift: variables and flags ------------------------------------------

SEPARATORS = re.compile(r"[|;&)`]")
PROGRAM = re.compile(r"pipeserver|pipeclient", re.IGNORECASE)


def logical_lines(text):
    """Lines with backslash continuations joined."""
    return re.sub(r"\\\n", " ", text).split("\n")


def check_flags_in_text(path, text):
    for line in logical_lines(text):
        hits = list(PROGRAM.finditer(line))
        for i, m in enumerate(hits):
            end = hits[i + 1].start() if i + 1 < len(hits) else len(line)
            segment = line[m.end():end]
            sep = SEPARATORS.search(segment)
            if sep:
                segment = segment[:sep.start()]
            known = SERVER_FLAGS if m.group(0).lower() == "pipeserver" else CLIENT_FLAGS
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", segment):
                if flag not in known:
                    bad(path, f"{m.group(0)} has no option {flag}: {line.strip()}")


def check_env_in_text(path, text):
    for name in sorted(set(re.findall(r"\bPIPETRAIN_[A-Z0-9_]+\b", text))):
        if name not in ENV_KNOWN:
            bad(path, f"{name} is neither a pipeserver option (server/config.c) "
                      f"nor read by getenv() in our sources")


DRIFT_FILES = [os.path.join(ROOT, "Dockerfile"), os.path.join(ROOT, "README.md")]
for path in sorted(glob.glob(os.path.join(ROOT, "deploy/**/*"), recursive=True)):
    if os.path.isfile(path) and not path.endswith("pipetrain-token"):
        DRIFT_FILES.append(path)
for path in DRIFT_FILES:
    text = read(path)
    check_env_in_text(path, text)
    check_flags_in_text(path, text)


# ---- descriptors (server/main.c: connection_limit) --------------------------

FD_RESERVE_MIN, FD_RESERVE_DIV, MIN_CONNECTIONS = 128, 8, 16


def connection_room(nofile):
    """API connections pipeserver allows under RLIMIT_NOFILE nofile."""
    return nofile - (FD_RESERVE_MIN + nofile // FD_RESERVE_DIV)


for path in sorted(glob.glob(os.path.join(ROOT, "deploy/*.service"))):
    text = read(path)
    if "pipeserver" not in text:
        continue
    for key in ("PrivateDevices", "ProtectClock", "DeviceAllow"):
        if re.search(rf"^{key}=", text, re.MULTILINE):
            bad(path, f"{key}= closes the device policy: /dev/nvidia* would be hidden")
    if re.search(r"^DevicePolicy=(closed|strict)", text, re.MULTILINE):
        bad(path, "DevicePolicy=closed or strict hides /dev/nvidia*")
    m = re.search(r"^LimitNOFILE=(\d+)(?::(\d+))?\s*$", text, re.MULTILINE)
    if not m:
        bad(path, "no LimitNOFILE=N (pipeserver raises its soft limit to it)")
        continue
    nofile = int(m.group(2) or m.group(1))
    if connection_room(nofile) < MIN_CONNECTIONS:
        bad(path, f"LimitNOFILE={nofile} leaves fewer than {MIN_CONNECTIONS} API connections")
    for want in re.findall(r"PIPETRAIN_MAX_CONNECTIONS=(\d+)", text):
        if int(want) > connection_room(nofile):
            bad(path, f"PIPETRAIN_MAX_CONNECTIONS={want} exceeds what LimitNOFILE={nofile} "
                      f"leaves ({connection_room(nofile)})")


# ---- YAML -----------------------------------------------------------------

def load_yaml(path):
    try:
        with open(path, encoding="utf-8") as f:
            return [d for d in yaml.safe_load_all(f) if d is not None]
    except yaml.YAMLError as e:
        bad(path, f"does not parse: {e}")
        return []


YAML = {}
for path in sorted(glob.glob(os.path.join(ROOT, "deploy/**/*.y*ml"), recursive=True)):
    YAML[path] = load_yaml(path)


def env_of(container):
    """A container's (or compose service's) environment as a dict."""
    env = container.get("env", container.get("environment")) or {}
    if isinstance(env, dict):
        return {k: (None if v is None else str(v)) for k, v in env.items()}
    out = {}
    for item in env:
        if isinstance(item, str):
            k, _, v = item.partition("=")
            out[k] = v
        else:
            out[item["name"]] = item.get("value")  # valueFrom: None
    return out


def port_of(url_or_addr):
    m = re.search(r":(\d+)$", url_or_addr or "")
    return int(m.group(1)) if m else None


def host_of(url_or_addr):
    s = re.sub(r"^[a-z0-9+]+://", "", url_or_addr or "")
    return s.rsplit(":", 1)[0].strip("[]")


def is_loopback(host):
    return host.startswith("127.") or host in ("localhost", "::1")


def check_token(path, who, env):
    """A server listening beyond loopback needs a token (main.c, http.c)."""
    if env.get("PIPETRAIN_WORKER") in ("true", "1", "yes"):
        listen = [env.get("PIPETRAIN_LISTEN") or "tcp://127.0.0.1:7600"]
    else:
        listen = (env.get("PIPETRAIN_LISTEN") or "tcp://127.0.0.1:7600").split(",")
        if env.get("PIPETRAIN_HTTP"):
            listen.append(env["PIPETRAIN_HTTP"])
    if any(not is_loopback(host_of(u)) for u in listen) and not env.get(
            "PIPETRAIN_AUTH_TOKEN_FILE"):
        bad(path, f"{who} listens beyond loopback without PIPETRAIN_AUTH_TOKEN_FILE")


def check_args(path, who, args):
    """Arguments given to the image's entry point, pipeserver."""
    if isinstance(args, str):
        args = args.split()
    for a in args or []:
        flag = str(a).split("=", 1)[0]
        if flag.startswith("--") and flag not in SERVER_FLAGS:
            bad(path, f"{who}: pipeserver has no option {flag}")


# ---- Kubernetes -------------------------------------------------------------

K8S_DIR = os.path.join(ROOT, "deploy/k8s")
objects = []  # (path, object)
for path, docs in YAML.items():
    if not path.startswith(K8S_DIR + os.sep):
        continue
    for d in docs:
        if not isinstance(d, dict):
            bad(path, "a document is not a mapping")
            continue
        if d.get("kind") == "Kustomization":
            for r in d.get("resources", []):
                if not os.path.isfile(os.path.join(os.path.dirname(path), r)):
                    bad(path, f"resource {r} does not exist")
            continue
        for key in ("apiVersion", "kind"):
            if not d.get(key):
                bad(path, f"an object has no {key}")
        if not (d.get("metadata") or {}).get("name"):
            bad(path, f"a {d.get('kind')} has no metadata.name")
        objects.append((path, d))


def named(kind):
    return {o["metadata"]["name"]: (p, o) for p, o in objects
            if o.get("kind") == kind and (o.get("metadata") or {}).get("name")}


services, secrets, claims = named("Service"), named("Secret"), named("PersistentVolumeClaim")
workloads = [(p, o) for p, o in objects if o.get("kind") in ("Deployment", "StatefulSet")]
if not any(o["kind"] == "StatefulSet" for _, o in workloads):
    bad(K8S_DIR, "no StatefulSet (workers)")
if not claims:
    bad(K8S_DIR, "no PersistentVolumeClaim (data directory)")
if not secrets:
    bad(K8S_DIR, "no Secret (token)")


def probe_port(path, who, probe, ports):
    action = probe.get("httpGet") or probe.get("tcpSocket") or {}
    port = action.get("port")
    if isinstance(port, str):
        if port not in ports:
            bad(path, f"{who}: probe port {port} is no named container port")
            return None
        return ports[port]
    return port


worker_sets = []  # (statefulset, container env, control port)
for path, w in workloads:
    name = w["metadata"]["name"]
    spec = w.get("spec") or {}
    tmpl = spec.get("template") or {}
    labels = (tmpl.get("metadata") or {}).get("labels") or {}
    match = (spec.get("selector") or {}).get("matchLabels") or {}
    if not match or any(labels.get(k) != v for k, v in match.items()):
        bad(path, f"{name}: selector.matchLabels do not match the template's labels")
    pod = tmpl.get("spec") or {}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for v in volumes.values():
        claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
        if claim and claim not in claims:
            bad(path, f"{name}: volume {v['name']} names no PVC {claim} here")
        secret = (v.get("secret") or {}).get("secretName")
        if secret and secret not in secrets:
            bad(path, f"{name}: volume {v['name']} names no Secret {secret} here")
    ctx = pod.get("securityContext") or {}
    if not ctx.get("runAsNonRoot"):
        bad(path, f"{name}: pod securityContext.runAsNonRoot is not true")
    for c in pod.get("containers", []):
        who = f"{name}/{c.get('name')}"
        env = env_of(c)
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        check_token(path, who, env)
        check_args(path, who, c.get("args"))
        if c.get("command"):
            bad(path, f"{who}: command replaces the image's entry point (pipeserver)")
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                bad(path, f"{who}: volumeMount {m['name']} has no volume")
        live, ready = c.get("livenessProbe"), c.get("readinessProbe")
        if not live or not ready:
            bad(path, f"{who}: needs both livenessProbe and readinessProbe")
            continue
        gpus = ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
        if env.get("PIPETRAIN_WORKER") in ("true", "1", "yes"):
            listen = port_of(env.get("PIPETRAIN_LISTEN"))
            for kind, p in (("liveness", live), ("readiness", ready)):
                if "tcpSocket" not in p:
                    bad(path, f"{who}: {kind} probe of a worker must be tcpSocket "
                              f"(workers serve no HTTP)")
                elif probe_port(path, who, p, ports) != listen:
                    bad(path, f"{who}: {kind} probe is not on PIPETRAIN_LISTEN's port {listen}")
            if gpus:
                bad(path, f"{who}: worker requests nvidia.com/gpu, which its stages "
                          f"cannot use (jobs on CUDA are not placed on workers)")
            if w["kind"] == "StatefulSet":
                worker_sets.append((w, env, listen))
        else:
            http = port_of(env.get("PIPETRAIN_HTTP"))
            if http is None:
                bad(path, f"{who}: server without PIPETRAIN_HTTP HOST:PORT (probes need it)")
            for kind, p, want in (("liveness", live, "/healthz"), ("readiness", ready, "/readyz")):
                get = p.get("httpGet") or {}
                if get.get("path") != want:
                    bad(path, f"{who}: {kind} probe must GET {want}, not {get.get('path')}")
                elif probe_port(path, who, p, ports) != http:
                    bad(path, f"{who}: {kind} probe is not on PIPETRAIN_HTTP's port {http}")
            if "RLIMIT_NOFILE" not in read(path):
                bad(path, f"{who}: no word on RLIMIT_NOFILE (Kubernetes has no ulimit "
                          f"field: say what the runtime gives)")
            data = env.get("PIPETRAIN_DATA_DIR")
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            if not data or "persistentVolumeClaim" not in volumes.get(mounts.get(data), {}):
                bad(path, f"{who}: PIPETRAIN_DATA_DIR is not a mounted PVC")
    if w["kind"] == "StatefulSet":
        svc = services.get(spec.get("serviceName"))
        if svc is None:
            bad(path, f"{name}: serviceName {spec.get('serviceName')} is no Service here")
        elif (svc[1].get("spec") or {}).get("clusterIP") != "None":
            bad(path, f"{name}: Service {spec.get('serviceName')} is not headless")

for name, (path, svc) in services.items():
    sel = (svc.get("spec") or {}).get("selector") or {}
    targets = [o for _, o in workloads
               if sel and all(((o["spec"]["template"].get("metadata") or {}).get("labels") or {})
                              .get(k) == v for k, v in sel.items())]
    if not targets:
        bad(path, f"Service {name} selects no workload here")
    for port in (svc.get("spec") or {}).get("ports", []):
        t = port.get("targetPort", port.get("port"))
        names = {p.get("name") for o in targets
                 for c in o["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        numbers = {p.get("containerPort") for o in targets
                   for c in o["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        if (isinstance(t, str) and t not in names) or (isinstance(t, int) and t not in numbers):
            bad(path, f"Service {name}: targetPort {t} is no container port")


def check_pool(path, what, env, want):
    """The server's PIPETRAIN_POOL names exactly the workers want."""
    got = [u.strip() for u in (env.get("PIPETRAIN_POOL") or "").split(",") if u.strip()]
    if got != want:
        bad(path, f"{what}: PIPETRAIN_POOL {got} does not name the workers {want}")


def check_job_placed(path, n_workers):
    """A shipped job names no workers (the server places it on its pool) and
    fits the pool."""
    placement = json.loads(read(path)).get("placement") or {}
    if placement.get("workers"):
        bad(path, "names placement.workers: the server's pool places it")
    if placement.get("stages", 1) > n_workers:
        bad(path, f"placement.stages {placement.get('stages')} > {n_workers} pool workers")


k8s_job = os.path.join(K8S_DIR, "digits-job.json")
if worker_sets:
    sts, _, listen = worker_sets[0]
    n = sts["spec"].get("replicas", 1)
    base, svc = sts["metadata"]["name"], sts["spec"]["serviceName"]
    for path, o in workloads:
        if o.get("kind") != "Deployment":
            continue
        for c in o["spec"]["template"]["spec"]["containers"]:
            check_pool(path, o["metadata"]["name"], env_of(c),
                       [f"tcp://{base}-{i}.{svc}:{listen}" for i in range(n)])
    if os.path.exists(k8s_job):
        check_job_placed(k8s_job, n)


# ---- docker-compose.yml ----------------------------------------------------

compose_path = os.path.join(ROOT, "deploy/docker-compose.yml")
compose = (YAML.get(compose_path) or [{}])[0]
svcs = compose.get("services") or {}
workers = []
server_seen = False
for name, s in svcs.items():
    env = env_of(s)
    check_token(compose_path, name, env)
    check_args(compose_path, name, s.get("command"))
    for sec in s.get("secrets", []):
        sec = sec if isinstance(sec, str) else sec.get("source")
        if sec not in (compose.get("secrets") or {}):
            bad(compose_path, f"{name}: secret {sec} is not defined")
    for vol in s.get("volumes", []):
        src = vol.split(":", 1)[0] if isinstance(vol, str) else vol.get("source")
        if not src.startswith((".", "/")) and src not in (compose.get("volumes") or {}):
            bad(compose_path, f"{name}: volume {src} is not defined")
    if env.get("PIPETRAIN_WORKER") in ("true", "1", "yes"):
        workers.append(f"tcp://{name}:{port_of(env.get('PIPETRAIN_LISTEN'))}")
    else:
        server_seen = True
        if not env.get("PIPETRAIN_HTTP"):
            bad(compose_path, f"{name}: no PIPETRAIN_HTTP (the image's health check needs it)")
if not server_seen or len(workers) < 2:
    bad(compose_path, f"needs a server and two workers (workers: {workers})")
for name, s in svcs.items():
    if env_of(s).get("PIPETRAIN_WORKER") not in ("true", "1", "yes"):
        check_pool(compose_path, name, env_of(s), sorted(workers))
compose_job = os.path.join(ROOT, "deploy/digits-compose.json")
if os.path.exists(compose_job):
    check_job_placed(compose_job, len(workers))


# ---- Dockerfile -------------------------------------------------------------

dockerfile = os.path.join(ROOT, "Dockerfile")
text = read(dockerfile)
joined = "\n".join(logical_lines(text))
froms = re.findall(r"^FROM\s+(\S+)", joined, re.MULTILINE)
if len(froms) < 2:
    bad(dockerfile, "is not multi-stage")
elif not re.search(r"-devel-", froms[0]) or not re.search(r"-runtime-", froms[-1]) or \
        froms[0].replace("-devel-", "-runtime-").split(" ")[0] != froms[-1]:
    bad(dockerfile, f"stages {froms} are not CUDA devel -> the matching runtime image")
for script in ("deploy/install-deps.sh", "deploy/build.sh", "deploy/stage.sh"):
    if not re.search(r"^RUN .*" + re.escape(script), joined, re.MULTILINE):
        bad(dockerfile, f"the build stage does not run {script} (CI's steps)")
user = re.findall(r"^USER\s+(\S+)", joined, re.MULTILINE)
if not user or user[-1].split(":")[0] in ("0", "root"):
    bad(dockerfile, "runs as root (no USER, or USER root)")
if not re.search(r"^HEALTHCHECK\s", joined, re.MULTILINE):
    bad(dockerfile, "has no HEALTHCHECK")
if not re.search(r'^ENTRYPOINT\s+\["pipeserver"', joined, re.MULTILINE):
    bad(dockerfile, 'ENTRYPOINT is not ["pipeserver", ...]')
data = re.search(r"PIPETRAIN_DATA_DIR=(\S+)", joined)
volumes = re.findall(r"^VOLUME\s+(.*)$", joined, re.MULTILINE)
if not data or not any(data.group(1) in v for v in volumes):
    bad(dockerfile, "the data directory (PIPETRAIN_DATA_DIR) is not a VOLUME")
http = re.search(r"PIPETRAIN_HTTP=(\S+)", joined)
expose = " ".join(re.findall(r"^EXPOSE\s+(.*)$", joined, re.MULTILINE)).split()
if not http or str(port_of(http.group(1))) not in expose:
    bad(dockerfile, "PIPETRAIN_HTTP's port is not EXPOSEd")
env = dict(re.findall(r"(PIPETRAIN_[A-Z_]+)=(\S+)", joined))
check_token(dockerfile, "the image", env)


if problems:
    print("deploy_check: %d problem(s):" % len(problems))
    for p in problems:
        print("  " + p)
    sys.exit(1)
print("deploy_check: %d YAML files, %d Kubernetes objects, %d drift files: ok"
      % (len(YAML), len(objects), len(DRIFT_FILES)))
