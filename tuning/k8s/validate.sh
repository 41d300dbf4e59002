#!/usr/bin/env bash
# Offline checks of tuning/k8s/ (run by .ci/run; no cluster, no network once installed):
#   1. every manifest against the Kubernetes OpenAPI schemas bundled in the PyPI package
#      kubernetes-validate, strict (unknown fields are errors), for the oldest Kubernetes
#      the manifests need (1.30: the preStop `sleep` action) and the newest the package has;
#   2. consistency the schemas cannot see: selectors, referenced ConfigMaps and ports,
#      Guaranteed QoS, the security context, the grace period against the drain settings,
#      kustomization.yaml listing every manifest;
#   3. each ConfigMap's spillway.toml through `spillway check-config` (the release binary;
#      skipped with a message when it is missing, except under CI).
# Env: SPILLWAY_K8S_VENV (default target/k8s-venv), SPILLWAY_BIN (default target/release/spillway).
set -euo pipefail
cd "$(dirname "$0")/../.."

TOOL_VERSION=1.37.0
K8S_VERSIONS=(1.30.0 1.37.0)
VENV="${SPILLWAY_K8S_VENV:-target/k8s-venv}"
BIN="${SPILLWAY_BIN:-target/release/spillway}"
DIR=tuning/k8s
WORK=target/k8s-check

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if [ "$("$VENV/bin/kubernetes-validate" --version 2>/dev/null)" != "$TOOL_VERSION" ]; then
  "$VENV/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$TOOL_VERSION"
fi

manifests=()
for f in "$DIR"/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
done

# 1. Schemas (multi-document files are split by the tool). It exits 0 on a kind or
# apiVersion it has no schema for, with a WARN line: with --quiet any output fails here,
# so a misspelt kind cannot pass.
for v in "${K8S_VERSIONS[@]}"; do
  rc=0
  out=$("$VENV/bin/kubernetes-validate" --strict --quiet -k "$v" "${manifests[@]}" 2>&1) || rc=$?
  if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
    echo "$out"
    echo "tuning/k8s: manifests do not validate against Kubernetes $v (kubernetes-validate $TOOL_VERSION)"
    exit 1
  fi
  echo "tuning/k8s: ${#manifests[@]} files valid against Kubernetes $v's schemas (strict)"
done

# 2. Consistency; writes each ConfigMap's spillway.toml into $WORK for step 3.
rm -rf "$WORK"
mkdir -p "$WORK"
"$VENV/bin/python" - "$DIR" "$WORK" <<'PY'
import glob, os, sys, tomllib, yaml

folder, work = sys.argv[1], sys.argv[2]
errors = []
docs = []
for path in sorted(glob.glob(os.path.join(folder, "*.yaml"))):
    if os.path.basename(path) == "kustomization.yaml":
        listed = yaml.safe_load(open(path)).get("resources", [])
        present = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "*.yaml"))
                         if os.path.basename(p) != "kustomization.yaml")
        if sorted(listed) != present:
            errors.append(f"kustomization.yaml lists {sorted(listed)}, the folder holds {present}")
        continue
    docs += [(path, d) for d in yaml.safe_load_all(open(path)) if d]

def name(d):
    return f"{d['kind']}/{d['metadata']['name']}"

configmaps = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "ConfigMap"}
workloads = [d for _, d in docs if d["kind"] in ("Deployment", "DaemonSet")]
configs = {}
for cm_name, cm in configmaps.items():
    text = cm.get("data", {}).get("spillway.toml")
    if text is None:
        continue
    out = os.path.join(work, cm_name + ".toml")
    open(out, "w").write(text)
    try:
        configs[cm_name] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        errors.append(f"ConfigMap/{cm_name}: spillway.toml: {e}")

def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())

for w in workloads:
    spec, pod = w["spec"], w["spec"]["template"]["spec"]
    labels = w["spec"]["template"]["metadata"].get("labels", {})
    if not selects(spec["selector"]["matchLabels"], labels):
        errors.append(f"{name(w)}: selector does not match the pod template's labels")
    psc = pod.get("securityContext", {})
    if not (psc.get("runAsNonRoot") and psc.get("runAsUser") == 10001):
        errors.append(f"{name(w)}: not runAsNonRoot with the image's uid 10001")
    if psc.get("seccompProfile", {}).get("type") not in ("Localhost", "RuntimeDefault"):
        errors.append(f"{name(w)}: no seccomp profile")
    mounted = {}
    for vol in pod.get("volumes", []):
        if "configMap" in vol:
            if vol["configMap"]["name"] not in configmaps:
                errors.append(f"{name(w)}: volume {vol['name']}: no ConfigMap "
                              f"{vol['configMap']['name']} in {folder}")
            mounted[vol["name"]] = vol["configMap"]["name"]
    for c in pod["containers"]:
        where = f"{name(w)}: container {c['name']}"
        res = c.get("resources", {})
        req, lim = res.get("requests", {}), res.get("limits", {})
        if not (req.get("cpu") == lim.get("cpu") and req.get("memory") == lim.get("memory")
                and str(lim.get("cpu", "")).isdigit() and lim.get("memory")):
            errors.append(f"{where}: not Guaranteed (integer CPUs, requests = limits)")
        sc = c.get("securityContext", {})
        if not (sc.get("allowPrivilegeEscalation") is False and sc.get("readOnlyRootFilesystem")
                and sc.get("capabilities", {}).get("drop") == ["ALL"]):
            errors.append(f"{where}: security context is not locked down")
        ports = {p.get("name") for p in c.get("ports", [])}
        for probe in ("readinessProbe", "livenessProbe"):
            port = c.get(probe, {}).get("httpGet", {}).get("port")
            if port is None or (isinstance(port, str) and port not in ports):
                errors.append(f"{where}: {probe} has no httpGet on a declared port")
        # The grace period must cover the preStop sleep and the whole drain.
        cm = next((mounted[m["name"]] for m in c.get("volumeMounts", [])
                   if m["mountPath"] == "/etc/spillway" and m["name"] in mounted), None)
        if cm is None or cm not in configs:
            errors.append(f"{where}: no spillway.toml mounted at /etc/spillway")
            continue
        cfg = configs[cm]
        pre = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        drain = (cfg.get("drain_grace_ms", 2000) + cfg.get("drain_timeout_ms", 60000)) / 1000
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace < pre + drain:
            errors.append(f"{where}: terminationGracePeriodSeconds {grace} < preStop {pre} s "
                          f"+ drain {drain:g} s (ConfigMap/{cm})")

# Every Service and PodDisruptionBudget selects a workload defined here, except the
# engines' Service, whose pods are the engines.
for _, d in docs:
    if d["kind"] == "Service" and d["metadata"]["name"] != "inference-engine":
        sel = d["spec"].get("selector", {})
    elif d["kind"] == "PodDisruptionBudget":
        sel = d["spec"]["selector"]["matchLabels"]
    else:
        continue
    if not sel or not any(selects(sel, w["spec"]["template"]["metadata"].get("labels", {}))
                          for w in workloads):
        errors.append(f"{name(d)}: selects no workload in {folder}")

for e in errors:
    print("ERROR", e)
print(f"tuning/k8s: consistency of {len(docs)} resources: "
      + ("OK" if not errors else f"{len(errors)} error(s)"))
sys.exit(1 if errors else 0)
PY

# 3. The embedded configs, as `spillway --config` would load them.
if [ ! -x "$BIN" ]; then
  if [ -n "${CI:-}" ]; then
    echo "tuning/k8s: $BIN missing (build it first: cargo build --release)"
    exit 1
  fi
  echo "tuning/k8s: $BIN not built: skipping check-config of the ConfigMaps' spillway.toml"
  exit 0
fi
for toml in "$WORK"/*.toml; do
  "$BIN" check-config "$toml" >/dev/null || {
    echo "tuning/k8s: ConfigMap $(basename "$toml" .toml): spillway.toml is not valid (lines as in $toml)"
    exit 1
  }
done
echo "tuning/k8s: manifests valid (kubernetes-validate $TOOL_VERSION, Kubernetes ${K8S_VERSIONS[*]})"
