#!/usr/bin/env python3
"""Rules for the rendered Kubernetes manifests of the gateway (deploy/kubernetes).

Schema validation (kubernetes-validate) says a document is a well-formed object; these rules
say the gateway deployed from it is safe and works. Run by scripts/check-kubernetes on the
output of `kubectl kustomize` for the base and every overlay:

    check_rules.py --profile base|demo|ha [--flags-doc docs/flags.md]
                   [--secrets EXAMPLE.yaml]... RENDERED.yaml

Exit 0 when every rule holds, 1 with one `error: [rule] ...` line per breach. Rules (the
bracketed id starts each message; check_rules_test.py breaks each one on purpose):

  one-shot           no Job or CronJob (every workload is long-running and probed)
  probes             every container has a readiness and a liveness probe (init containers:
                     only restartable "sidecar" ones may, and then must, have probes)
  probe-paths        the gateway's probes ask what each binary serves, on the port it serves it:
                     data plane /readyz and /healthz on --admin-listen, auth service /healthz,
                     mocks /health, control plane grpc.health.v1 on --listen
  resources          cpu and memory requests and limits on every container, request <= limit
  non-root           runAsNonRoot and a numeric non-zero runAsUser (pod or container)
  read-only-root     readOnlyRootFilesystem on every container
  privilege-escalation  allowPrivilegeEscalation false, never privileged
  capabilities       drop ALL, add none
  seccomp            seccompProfile RuntimeDefault or Localhost (pod or container)
  pod-security       no hostNetwork/hostPID/hostIPC, no hostPath volume
  service-account-token  automountServiceAccountToken false (nothing here talks to the API)
  inline-secret      no secret written into a manifest: env `value:` of a token/password/
                     secret/key-like name (unless a file path), a URL with a password in an env
                     value or argument (unless the password is a $(VAR) reference), a
                     --*-token/--*-password/--*-secret argument with a value, a secret-like
                     ConfigMap key
  secret-in-manifests  no Secret object rendered (Secrets are made out of band, so that
                     `kubectl apply -k` never overwrites them; see secrets.example.yaml)
  secret-refs        every Secret and key referenced is one the --secrets examples list
  entrypoint         gateway containers set `args`, never `command` (the image's entrypoint
                     writes the control plane's tokens file, sets node and instance ids)
  flags              every --flag of a gateway container is one its binary takes (once), and
                     every environment variable one docs/flags.md lists for it (--flags-doc)
  writable           each path a gateway binary writes (data-plane cache, SQLite files, signing
                     keys, the tokens file) is on a writable emptyDir or volume claim
  sqlite-single-writer  a control plane or auth service on SQLite runs as exactly 1 replica
  data-plane-autoscaling  the data plane has an autoscaling/v2 HPA on CPU and a
                     PodDisruptionBudget selecting its pods
  drain              the data plane has a preStop sleep, a --drain-delay-ms above 0, and a
                     terminationGracePeriodSeconds >= preStop + drain delay + shutdown timeout
  replicas           profile ha: 3+ data planes (Deployment and HPA minimum), 2+ control planes
  network-policy     who reaches whom, evaluated with NetworkPolicy semantics: Redis only from
                     data planes and the auth service (and Redis itself), upstreams and the auth
                     service only from data planes, the control plane's gRPC port only from data
                     planes and operator pods, the data plane's ops port only from scrapers;
                     and those needed paths (and clients to the data planes) are open
  services           every Service selects some pod, and its named target ports exist there
  references         every in-cluster URL of the gateway's arguments, environment and seed
                     configuration names a rendered Service and one of its ports; every $(VAR)
                     names a variable defined before it in the same container

Needs PyYAML (`pip install pyyaml`).
"""

import argparse
import copy
import json
import os
import re
import sys
from urllib.parse import urlsplit

import yaml

GATEWAY_BINARIES = ("control-plane", "data-plane", "auth-service", "mock-service")
# The image's WORKDIR (Dockerfile): relative paths of the binaries are below it.
IMAGE_WORKDIR = "/var/lib/gateway"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Pod", "Job", "CronJob")
NAME = "app.kubernetes.io/name"
COMPONENT = "app.kubernetes.io/component"
OPERATOR_LABEL = "gateway/operator"
SCRAPER_LABEL = "gateway/metrics-scraper"

# Last `_`/`-` separated word of an environment variable or flag that holds a secret.
SECRET_WORDS = {"token", "password", "passwd", "secret", "key", "apikey", "credentials", "credential"}
# Variables whose value holds secrets whatever their name says (docs/flags.md).
SECRET_ENV = {"GATEWAY_SEED_USERS"}
VAR_REF = re.compile(r"\$\([A-Za-z_][A-Za-z0-9_]*\)")


# ------------------------------------------------------------------------------------------
# Small helpers
# ------------------------------------------------------------------------------------------
def load_documents(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def ident(doc):
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


def pod_spec(doc):
    """The pod spec of a workload document, or None."""
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        return (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}).get("spec")
    if kind in WORKLOAD_KINDS:
        return (spec.get("template") or {}).get("spec")
    return None


def pod_labels(doc):
    if doc.get("kind") == "Pod":
        return (doc.get("metadata") or {}).get("labels") or {}
    return (((doc.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}


def all_containers(spec):
    """(container, is_init) for every container and init container."""
    for c in spec.get("initContainers") or []:
        yield c, True
    for c in spec.get("containers") or []:
        yield c, False


def selector_matches(selector, labels):
    """A LabelSelector (matchLabels/matchExpressions) against a label map. Empty: everything."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(q):
    m = QUANTITY.match(str(q))
    if not m or m.group(2) not in SUFFIX:
        return None
    return float(m.group(1)) * SUFFIX[m.group(2)]


def image_name(image):
    """`registry/path/gateway:tag@sha` -> `gateway`."""
    name = (image or "").split("@")[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":")[0]


def gateway_binary(container):
    """The gateway binary a container runs, or None for other images."""
    args = container.get("args") or []
    if image_name(container.get("image")) == "gateway" or (args and args[0] in GATEWAY_BINARIES):
        return args[0] if args and args[0] in GATEWAY_BINARIES else "?"
    return None


def option(container, flag, env=None):
    """(value, source) of --flag (`--flag=V` or `--flag V`) or of the variable `env`.
    The flag wins, as in the binaries. source: 'arg', 'value', 'secret' or None."""
    args = [str(a) for a in container.get("args") or []]
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1], "arg"
        if a.startswith(flag + "="):
            return a.split("=", 1)[1], "arg"
    if env:
        for e in container.get("env") or []:
            if e.get("name") == env:
                if "valueFrom" in e:
                    return None, "secret"
                return str(e.get("value", "")), "value"
    return None, None


def env_value(container, name):
    for e in container.get("env") or []:
        if e.get("name") == name:
            return e
    return None


def ms(value, default):
    try:
        return int(value) if value is not None else default
    except ValueError:
        return None


def port_number(container, port):
    """A probe's or Service's port (number or name) as a number, or None."""
    if isinstance(port, int):
        return port
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return p.get("containerPort")
    if isinstance(port, str) and port.isdigit():
        return int(port)
    return None


def listen_port(value):
    if not value:
        return None
    m = re.search(r":(\d+)$", value)
    return int(m.group(1)) if m else None


# ------------------------------------------------------------------------------------------
# docs/flags.md: flags and variables per binary
# ------------------------------------------------------------------------------------------
def parse_flags_doc(text):
    """{binary: {"flags": set, "env": set}} plus "*": variables read outside clap."""
    out, section = {"*": {"flags": set(), "env": set()}}, None
    for line in text.split("\n"):
        m = re.match(r"^(#{2,3}) (.+?)\s*$", line)
        if m:
            title = m.group(2)
            if m.group(1) == "##":
                if title in GATEWAY_BINARIES or title == "devstack":
                    section = title
                elif title.startswith("Environment variables read outside clap"):
                    section = "*"
                else:
                    section = None
            elif section != "*" and title.split(" ")[0] in GATEWAY_BINARIES and " " in title:
                section = None  # subcommands (auth-service users ...): not what a pod runs
            if section and section not in out:
                out[section] = {"flags": set(), "env": set()}
            continue
        if not section or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if section == "*":
            m = re.match(r"^`([A-Z][A-Z0-9_]*)`$", cells[0])
            if m:
                out["*"]["env"].add(m.group(1))
            continue
        m = re.match(r"^`(--[a-z0-9-]+)", cells[0])
        if m:
            out[section]["flags"].add(m.group(1))
            if len(cells) > 1:
                m = re.match(r"^`([A-Z][A-Z0-9_]*)`$", cells[1])
                if m:
                    out[section]["env"].add(m.group(1))
    return out


# ------------------------------------------------------------------------------------------
# The checker
# ------------------------------------------------------------------------------------------
class Checker:
    def __init__(self, docs, profile="base", flags_doc=None, example_secrets=None):
        self.docs = [d for d in docs if isinstance(d, dict)]
        self.profile = profile
        self.flags = parse_flags_doc(flags_doc) if flags_doc else None
        self.example_secrets = example_secrets
        self.errors = []
        self.workloads = [d for d in self.docs if d.get("kind") in WORKLOAD_KINDS and pod_spec(d)]
        self.services = [d for d in self.docs if d.get("kind") == "Service"]
        self.policies = [d for d in self.docs if d.get("kind") == "NetworkPolicy"]

    def err(self, rule, where, message):
        self.errors.append(f"[{rule}] {where}: {message}")

    def run(self):
        for doc in self.docs:
            if doc.get("kind") in ("Job", "CronJob"):
                self.err("one-shot", ident(doc), "one-shot workloads are not expected here: "
                         "every workload is long-running, probed and limited")
            if doc.get("kind") == "Secret":
                self.err("secret-in-manifests", ident(doc), "a Secret is rendered: `kubectl apply -k` "
                         "would overwrite the real one with it. Create Secrets out of band "
                         "(secrets.example.yaml)")
            if doc.get("kind") == "ConfigMap":
                for key in (doc.get("data") or {}):
                    if self.secret_like(key):
                        self.err("inline-secret", ident(doc), f"ConfigMap key {key!r} looks like a secret")
        for doc in self.workloads:
            self.check_pod(doc)
        self.check_secret_refs()
        self.check_data_plane()
        self.check_single_writers()
        self.check_replicas()
        self.check_network_policies()
        self.check_services()
        self.check_references()
        return self.errors

    # -------------------------------------------------------------------- pods and containers
    @staticmethod
    def secret_like(name):
        words = [w for w in re.split(r"[_\-.]", name.lower()) if w]
        return bool(words) and (words[-1] in SECRET_WORDS or name.upper() in SECRET_ENV)

    def check_pod(self, doc):
        spec, where = pod_spec(doc), ident(doc)
        psc = spec.get("securityContext") or {}
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(flag):
                self.err("pod-security", where, f"{flag} is on")
        for v in spec.get("volumes") or []:
            if "hostPath" in v:
                self.err("pod-security", where, f"volume {v.get('name')} is a hostPath")
        if spec.get("automountServiceAccountToken") is not False:
            self.err("service-account-token", where, "automountServiceAccountToken is not false")
        for c, is_init in all_containers(spec):
            cw = f"{where} container {c.get('name')}"
            self.check_probes(cw, c, is_init)
            self.check_resources(cw, c)
            self.check_security(cw, c, psc)
            self.check_inline_secrets(cw, c)
            binary = gateway_binary(c)
            if binary:
                self.check_gateway_container(doc, cw, c, binary)

    def check_probes(self, where, c, is_init):
        if is_init and c.get("restartPolicy") != "Always":
            return  # the API forbids probes on ordinary init containers
        for probe in ("readinessProbe", "livenessProbe"):
            if not c.get(probe):
                self.err("probes", where, f"no {probe}")

    def check_resources(self, where, c):
        res = c.get("resources") or {}
        for part in ("requests", "limits"):
            for r in ("cpu", "memory"):
                if (res.get(part) or {}).get(r) in (None, ""):
                    self.err("resources", where, f"no {part}.{r}")
        for r in ("cpu", "memory"):
            req, lim = (res.get("requests") or {}).get(r), (res.get("limits") or {}).get(r)
            if req is not None and lim is not None:
                qr, ql = quantity(req), quantity(lim)
                if qr is None or ql is None:
                    self.err("resources", where, f"unreadable {r} quantity ({req!r}, {lim!r})")
                elif qr > ql:
                    self.err("resources", where, f"{r} request {req} is above its limit {lim}")

    def check_security(self, where, c, psc):
        sc = c.get("securityContext") or {}

        def eff(key):
            return sc[key] if key in sc else psc.get(key)

        if eff("runAsNonRoot") is not True:
            self.err("non-root", where, "runAsNonRoot is not true")
        uid = eff("runAsUser")
        if not isinstance(uid, int) or uid == 0:
            self.err("non-root", where, f"runAsUser is {uid!r}: a numeric non-zero uid is needed "
                     "(the kubelet cannot prove a named USER is non-root)")
        if sc.get("readOnlyRootFilesystem") is not True:
            self.err("read-only-root", where, "readOnlyRootFilesystem is not true")
        if sc.get("allowPrivilegeEscalation") is not False:
            self.err("privilege-escalation", where, "allowPrivilegeEscalation is not false")
        if sc.get("privileged"):
            self.err("privilege-escalation", where, "privileged")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            self.err("capabilities", where, "capabilities.drop does not hold ALL")
        if caps.get("add"):
            self.err("capabilities", where, f"capabilities.add: {caps['add']}")
        seccomp = (eff("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            self.err("seccomp", where, f"seccompProfile is {seccomp!r}, not RuntimeDefault/Localhost")

    def check_inline_secrets(self, where, c):
        def url_with_password(text):
            for m in re.finditer(r"[a-z][a-z0-9+.-]*://([^/@\s]*)@", text):
                userinfo = m.group(1)
                if ":" in userinfo:
                    password = userinfo.split(":", 1)[1]
                    if password and not VAR_REF.fullmatch(password):
                        return True
            return False

        for e in c.get("env") or []:
            name, value = e.get("name", ""), e.get("value")
            if value in (None, ""):
                continue
            value = str(value)
            if self.secret_like(name) and not value.startswith("/") and VAR_REF.sub("", value) != "":
                self.err("inline-secret", where, f"env {name} has its value written in the manifest: "
                         "use valueFrom.secretKeyRef")
            elif url_with_password(value):
                self.err("inline-secret", where, f"env {name} holds a URL with a password: "
                         "take the password from a Secret ($(VAR) or secretKeyRef)")
        args = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
        for i, a in enumerate(args):
            if url_with_password(a):
                self.err("inline-secret", where, f"argument {a.split('=')[0]!r} holds a URL with a password")
            m = re.match(r"^--([a-z0-9-]+)(?:=(.*))?$", a)
            if m and self.secret_like(m.group(1)):
                value = m.group(2) if m.group(2) is not None else (args[i + 1] if i + 1 < len(args) else "")
                if value and not value.startswith("/") and not value.startswith("-") \
                        and VAR_REF.sub("", value) != "":
                    self.err("inline-secret", where, f"--{m.group(1)} is given a secret on the command "
                             "line (visible in ps and in the manifest): use its environment variable "
                             "from a Secret")

    # ------------------------------------------------------------------ gateway containers
    def check_gateway_container(self, doc, where, c, binary):
        if c.get("command"):
            self.err("entrypoint", where, "sets `command`, which skips the image's entrypoint: "
                     "put the binary and its flags in `args`")
        if binary == "?":
            self.err("flags", where, f"args do not start with a gateway binary {GATEWAY_BINARIES}")
            return
        if self.flags is not None:
            known = self.flags.get(binary, {"flags": set(), "env": set()})
            seen = set()
            for a in (c.get("args") or [])[1:]:
                m = re.match(r"^(--[a-z0-9-]+)", str(a))
                if m and m.group(1) not in known["flags"]:
                    self.err("flags", where, f"{binary} takes no flag {m.group(1)} (docs/flags.md)")
                elif m and m.group(1) in seen:
                    self.err("flags", where, f"{m.group(1)} is given twice (the binary refuses that)")
                if m:
                    seen.add(m.group(1))
            for e in c.get("env") or []:
                name = e.get("name")
                if name not in known["env"] and name not in self.flags["*"]["env"]:
                    self.err("flags", where, f"environment variable {name} is not one docs/flags.md "
                             f"lists for {binary}")
        self.check_writable(doc, where, c, binary)
        self.check_probe_paths(where, c, binary)

    def check_writable(self, doc, where, c, binary):
        paths = []

        def file_option(flag, env, default):
            value, source = option(c, flag, env)
            if source == "secret" or (value and "://" in value):
                return None  # a database URL: nothing written locally
            return value or default

        if binary == "data-plane":
            value, _ = option(c, "--cache-dir", "DP_CACHE_DIR")
            if value:
                paths.append(("--cache-dir", value))
        elif binary == "control-plane":
            db = file_option("--database", "CONTROL_PLANE_DATABASE", "control-plane.db")
            if db:
                paths.append(("--database (its directory)", os.path.dirname(self.abs(c, db))))
            tokens_given = any(env_value(c, n) for n in
                               ("GATEWAY_ADMIN_TOKEN", "GATEWAY_DATA_PLANE_TOKEN", "GATEWAY_VIEWER_TOKEN"))
            if tokens_given and option(c, "--auth-tokens-file")[0] is None:
                tf = (env_value(c, "GATEWAY_TOKENS_FILE") or {}).get("value") or "/var/lib/gateway/auth-tokens"
                paths.append(("GATEWAY_TOKENS_FILE (its directory)", os.path.dirname(self.abs(c, tf))))
        elif binary == "auth-service":
            db = file_option("--database", "AUTH_DATABASE", "auth.db")
            if db:
                paths.append(("--database (its directory)", os.path.dirname(self.abs(c, db))))
            kd, _ = option(c, "--key-dir", "AUTH_KEY_DIR")
            paths.append(("--key-dir", kd or "auth-keys"))
        spec = pod_spec(doc)
        volumes = {v.get("name"): v for v in spec.get("volumes") or []}
        claims = {t["metadata"]["name"] for t in (doc.get("spec") or {}).get("volumeClaimTemplates") or []}
        for what, path in paths:
            path = os.path.normpath(self.abs(c, path))
            mount = None
            for m in c.get("volumeMounts") or []:
                mp = os.path.normpath(m.get("mountPath", ""))
                if (path == mp or path.startswith(mp.rstrip("/") + "/")) and \
                        (mount is None or len(mp) > len(mount.get("mountPath", ""))):
                    mount = m
            if mount is None:
                self.err("writable", where, f"{what} {path} is on the read-only root filesystem: "
                         "mount an emptyDir or a volume claim there")
                continue
            vol = volumes.get(mount.get("name"))
            writable_kind = mount.get("name") in claims or (
                vol is not None and ("emptyDir" in vol or "persistentVolumeClaim" in vol
                                     or "ephemeral" in vol))
            if mount.get("readOnly") or not writable_kind:
                self.err("writable", where, f"{what} {path} is on volume {mount.get('name')!r}, "
                         "which is not a writable emptyDir or volume claim")

    @staticmethod
    def abs(c, path):
        return path if path.startswith("/") else os.path.join(c.get("workingDir") or IMAGE_WORKDIR, path)

    def check_probe_paths(self, where, c, binary):
        def http(probe):
            g = (c.get(probe) or {}).get("httpGet")
            return (g.get("path"), port_number(c, g.get("port"))) if g else None

        if binary == "data-plane":
            admin = listen_port(option(c, "--admin-listen", "DP_ADMIN_LISTEN")[0] or "127.0.0.1:9901")
            want = {"readinessProbe": ("/readyz", admin), "livenessProbe": ("/healthz", admin)}
        elif binary == "auth-service":
            port = listen_port(option(c, "--listen", "AUTH_LISTEN")[0] or "127.0.0.1:4000")
            want = {"readinessProbe": ("/healthz", port), "livenessProbe": ("/healthz", port)}
        elif binary == "mock-service":
            port = listen_port(option(c, "--listen", "MOCK_LISTEN")[0] or "127.0.0.1:7001")
            want = {"readinessProbe": ("/health", port), "livenessProbe": ("/health", port)}
        else:  # control-plane: gRPC health on --listen; over TLS, a TCP connection to it
            port = listen_port(option(c, "--listen", "CONTROL_PLANE_LISTEN")[0] or "127.0.0.1:50051")
            tls = any(option(c, flag, env)[0] for flag, env in (
                ("--tls-cert", "CONTROL_PLANE_TLS_CERT"),
                ("--tls-generate-dir", "CONTROL_PLANE_TLS_GENERATE_DIR")))
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                p = c.get(probe)
                if p is None:
                    continue
                if tls:
                    t = p.get("tcpSocket")
                    if not t or t.get("port") != port:
                        self.err("probe-paths", where, f"{probe} must be a tcpSocket probe on port "
                                 f"{port}: the kubelet's gRPC probe cannot speak TLS, and the "
                                 "control plane serves no HTTP health endpoint")
                    continue
                g = p.get("grpc")
                if not g or g.get("port") != port or g.get("service", "") not in ("", None):
                    self.err("probe-paths", where, f"{probe} must be the gRPC health probe on port "
                             f"{port} (the control plane serves no HTTP health endpoint)")
            return
        for probe, (path, port) in want.items():
            got = http(probe)
            if c.get(probe) and got != (path, port):
                self.err("probe-paths", where, f"{probe} asks {got}, but {binary} serves {path} "
                         f"on port {port}")
        # Listening on loopback only would make every probe fail.
        for flag, env in (("--listen", None), ("--admin-listen", "DP_ADMIN_LISTEN")):
            value = option(c, flag, env)[0]
            if value and value.startswith("127."):
                self.err("probe-paths", where, f"{flag}={value} is loopback: the kubelet cannot reach it")

    # ------------------------------------------------------------------------- secrets
    def check_secret_refs(self):
        if self.example_secrets is None:
            return
        for doc in self.workloads:
            spec = pod_spec(doc)
            refs = []
            for c, _ in all_containers(spec):
                for e in c.get("env") or []:
                    ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                    if ref:
                        refs.append((ref.get("name"), ref.get("key")))
                for ef in c.get("envFrom") or []:
                    if ef.get("secretRef"):
                        refs.append((ef["secretRef"].get("name"), None))
            for v in spec.get("volumes") or []:
                if v.get("secret"):
                    items = v["secret"].get("items") or []
                    refs += [(v["secret"].get("secretName"), i.get("key")) for i in items] or \
                        [(v["secret"].get("secretName"), None)]
            for name, key in refs:
                if name not in self.example_secrets:
                    self.err("secret-refs", ident(doc), f"Secret {name!r} is in no secrets example")
                elif key is not None and key not in self.example_secrets[name]:
                    self.err("secret-refs", ident(doc), f"Secret {name!r} has no key {key!r} in its example")

    # ----------------------------------------------------------------------- data plane
    def gateway_workloads(self, binary):
        out = []
        for doc in self.workloads:
            for c in pod_spec(doc).get("containers") or []:
                if gateway_binary(c) == binary:
                    out.append((doc, c))
        return out

    def check_data_plane(self):
        dps = self.gateway_workloads("data-plane")
        if not dps:
            self.err("data-plane-autoscaling", "manifests", "no data-plane workload")
            return
        for doc, c in dps:
            where = ident(doc)
            hpas = [h for h in self.docs if h.get("kind") == "HorizontalPodAutoscaler"
                    and ((h.get("spec") or {}).get("scaleTargetRef") or {}).get("name") == doc["metadata"]["name"]
                    and ((h.get("spec") or {}).get("scaleTargetRef") or {}).get("kind") == doc["kind"]]
            if not hpas:
                self.err("data-plane-autoscaling", where, "no HorizontalPodAutoscaler targets it")
            for h in hpas:
                if h.get("apiVersion") != "autoscaling/v2":
                    self.err("data-plane-autoscaling", ident(h), f"apiVersion {h.get('apiVersion')}, "
                             "not autoscaling/v2")
                cpu = [m for m in (h["spec"].get("metrics") or []) if m.get("type") == "Resource"
                       and (m.get("resource") or {}).get("name") == "cpu"]
                if not cpu:
                    self.err("data-plane-autoscaling", ident(h), "no CPU resource metric")
                lo, hi = h["spec"].get("minReplicas", 1), h["spec"].get("maxReplicas", 0)
                replicas = (doc.get("spec") or {}).get("replicas")
                if replicas is not None and not lo <= replicas <= hi:
                    self.err("data-plane-autoscaling", where, f"replicas {replicas} is outside the "
                             f"autoscaler's {lo}..{hi}")
                if lo < 2:
                    self.err("data-plane-autoscaling", ident(h), f"minReplicas {lo}: one data plane "
                             "is a single point of failure")
            labels = pod_labels(doc)
            pdbs = [p for p in self.docs if p.get("kind") == "PodDisruptionBudget"
                    and selector_matches((p.get("spec") or {}).get("selector"), labels)]
            if not pdbs:
                self.err("data-plane-autoscaling", where, "no PodDisruptionBudget selects its pods")
            self.check_drain(doc, c)

    def check_drain(self, doc, c):
        where = f"{ident(doc)} container {c.get('name')}"
        pre = ((c.get("lifecycle") or {}).get("preStop")) or {}
        sleep_s = None
        if "sleep" in pre:
            sleep_s = (pre["sleep"] or {}).get("seconds")
        elif "exec" in pre:
            cmd = [str(x) for x in (pre["exec"] or {}).get("command") or []]
            if len(cmd) == 2 and os.path.basename(cmd[0]) == "sleep" and cmd[1].isdigit():
                sleep_s = int(cmd[1])
        if sleep_s is None:
            self.err("drain", where, "no preStop sleep: the pod would stop before the Service's "
                     "endpoints forget it")
            sleep_s = 0
        drain = ms(option(c, "--drain-delay-ms", "DP_DRAIN_DELAY_MS")[0], 0)
        shutdown = ms(option(c, "--shutdown-timeout-ms", "DP_SHUTDOWN_TIMEOUT_MS")[0], 10000)
        if drain is None or shutdown is None:
            self.err("drain", where, "unreadable --drain-delay-ms or --shutdown-timeout-ms")
            return
        if drain <= 0:
            self.err("drain", where, "--drain-delay-ms is 0: /readyz never turns 503 before the "
                     "listeners close")
        grace = pod_spec(doc).get("terminationGracePeriodSeconds", 30)
        need = sleep_s + (drain + shutdown) / 1000
        if grace < need:
            self.err("drain", where, f"terminationGracePeriodSeconds {grace} < preStop {sleep_s} s + "
                     f"drain {drain} ms + shutdown {shutdown} ms = {need:g} s: SIGKILL mid-drain")

    # ------------------------------------------------------------------ replicas
    def check_single_writers(self):
        for binary, flag, env in (("control-plane", "--database", "CONTROL_PLANE_DATABASE"),
                                  ("auth-service", "--database", "AUTH_DATABASE")):
            for doc, c in self.gateway_workloads(binary):
                value, source = option(c, flag, env)
                sqlite = source != "secret" and not (value and "://" in value and not value.startswith("sqlite:"))
                replicas = (doc.get("spec") or {}).get("replicas", 1)
                if sqlite and (replicas != 1 or doc["kind"] not in ("StatefulSet", "Deployment")):
                    self.err("sqlite-single-writer", ident(doc), f"{binary} on SQLite with "
                             f"{replicas} replicas: SQLite has one writer, on one volume")
                if sqlite and doc["kind"] == "Deployment" and \
                        ((doc["spec"].get("strategy") or {}).get("type") != "Recreate"):
                    self.err("sqlite-single-writer", ident(doc), "a Deployment on SQLite needs strategy "
                             "Recreate (a rolling update runs two writers)")

    def check_replicas(self):
        if self.profile != "ha":
            return
        for doc, _ in self.gateway_workloads("data-plane"):
            replicas = (doc.get("spec") or {}).get("replicas")
            if replicas is None or replicas < 3:
                self.err("replicas", ident(doc), f"replicas {replicas}: HA needs 3 or more data planes")
            for h in self.docs:
                if h.get("kind") == "HorizontalPodAutoscaler" and \
                        ((h.get("spec") or {}).get("scaleTargetRef") or {}).get("name") == doc["metadata"]["name"]:
                    if h["spec"].get("minReplicas", 1) < 3:
                        self.err("replicas", ident(h), f"minReplicas {h['spec'].get('minReplicas', 1)}: "
                                 "HA needs 3 or more")
        cps = self.gateway_workloads("control-plane")
        if not cps:
            self.err("replicas", "manifests", "no control plane")
        for doc, _ in cps:
            if (doc.get("spec") or {}).get("replicas", 1) < 2:
                self.err("replicas", ident(doc), "HA needs 2 or more control planes")

    # ---------------------------------------------------------------- network policies
    def pod_ports(self, labels):
        """{name: number} of the container ports of rendered pods with these labels."""
        out = {}
        for doc in self.workloads:
            if pod_labels(doc) == labels:
                for c in pod_spec(doc).get("containers") or []:
                    for p in c.get("ports") or []:
                        if p.get("name"):
                            out[p["name"]] = p.get("containerPort")
        return out

    def reachable(self, target, source, port):
        """Whether `source` may open a TCP connection to pods labelled `target` on `port`.
        source: {"ns": namespace or None (outside the cluster), "labels": {...}}."""
        ns = self.namespace()
        selecting = [p for p in self.policies
                     if selector_matches((p.get("spec") or {}).get("podSelector", {}), target)
                     and "Ingress" in ((p.get("spec") or {}).get("policyTypes") or ["Ingress"])]
        if not selecting:
            return True  # not isolated
        named = self.pod_ports(target)
        for p in selecting:
            for rule in (p.get("spec") or {}).get("ingress") or []:
                ports = rule.get("ports")
                if ports and not any(self.port_matches(pp, port, named) for pp in ports):
                    continue
                peers = rule.get("from")
                if not peers:
                    return True
                for peer in peers:
                    if self.peer_admits(peer, source, ns):
                        return True
        return False

    @staticmethod
    def port_matches(pp, port, named):
        if (pp.get("protocol") or "TCP") != "TCP":
            return False
        want = pp.get("port")
        if want is None:
            return True
        if isinstance(want, str) and not want.isdigit():
            want = named.get(want)
        if want is None:
            return False
        want = int(want)
        return want <= port <= pp.get("endPort", want)

    @staticmethod
    def peer_admits(peer, source, ns):
        if "ipBlock" in peer:
            return True  # an address range may hold anything, in or outside the cluster
        if source["ns"] is None:
            return False
        ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
        if ns_sel is not None:
            if not selector_matches(ns_sel, {"kubernetes.io/metadata.name": source["ns"]}):
                return False
        elif source["ns"] != ns:
            return False
        return pod_sel is None or selector_matches(pod_sel, source["labels"])

    def namespace(self):
        for d in self.docs:
            ns = (d.get("metadata") or {}).get("namespace")
            if ns:
                return ns
        return "default"

    def check_network_policies(self):
        ns = self.namespace()

        def role_labels(name, synthetic):
            rendered = [pod_labels(d) for d in self.workloads if pod_labels(d).get(NAME) == name]
            return rendered or [synthetic]

        dp = {"ns": ns, "labels": {NAME: "data-plane"}}
        auth = {"ns": ns, "labels": {NAME: "auth-service"}}
        cp = {"ns": ns, "labels": {NAME: "control-plane"}}
        redis = {"ns": ns, "labels": {NAME: "redis"}}
        upstream = {"ns": ns, "labels": {COMPONENT: "upstream"}}
        any_pod = {"ns": ns, "labels": {}}
        other_ns = {"ns": "elsewhere", "labels": {}}
        operator = {"ns": "operators", "labels": {OPERATOR_LABEL: "true"}}
        scraper = {"ns": "monitoring", "labels": {SCRAPER_LABEL: "true"}}
        # A pod labelled as a scraper in a namespace that is not the scraper's: anyone who may
        # create pods somewhere in the cluster can set a label (issue 41, item 17).
        rogue_scraper = {"ns": "elsewhere", "labels": {SCRAPER_LABEL: "true"}}
        outside = {"ns": None, "labels": {}}
        named = {"data planes": dp, "the auth service": auth, "the control plane": cp,
                 "Redis": redis, "an upstream": upstream, "any pod of the namespace": any_pod,
                 "a pod of another namespace": other_ns, "an operator pod": operator,
                 "a metrics scraper": scraper, "outside the cluster": outside,
                 "a scraper-labelled pod of another namespace": rogue_scraper}

        def expect(what, targets, ports, allowed, denied):
            for target in targets:
                for port in ports:
                    for who in allowed:
                        if not self.reachable(target, named[who], port):
                            self.err("network-policy", f"{what} port {port}",
                                     f"{who} cannot connect, but must")
                    for who in denied:
                        if self.reachable(target, named[who], port):
                            self.err("network-policy", f"{what} port {port}",
                                     f"{who} can connect, but must not")

        everyone = list(named)
        redis_ports = [6379] + ([26379] if self.profile == "ha" else [])
        expect("Redis", role_labels("redis", {NAME: "redis"}), redis_ports,
               ["data planes", "the auth service"],
               [w for w in everyone if w not in ("data planes", "the auth service", "Redis")])
        upstreams = [pod_labels(d) for d in self.workloads if pod_labels(d).get(COMPONENT) == "upstream"]
        expect("upstreams", upstreams + [{COMPONENT: "upstream"}], [80, 7001, 7002, 8080],
               ["data planes"], [w for w in everyone if w != "data planes"])
        expect("auth service", role_labels("auth-service", {NAME: "auth-service"}), [4000],
               ["data planes"], [w for w in everyone if w != "data planes"])
        expect("control plane gRPC", role_labels("control-plane", {NAME: "control-plane"}), [50051],
               ["data planes", "an operator pod"],
               [w for w in everyone if w not in ("data planes", "an operator pod")])
        expect("data plane ops listener", role_labels("data-plane", {NAME: "data-plane"}), [9901],
               ["a metrics scraper"], [w for w in everyone if w != "a metrics scraper"])
        expect("control plane metrics", role_labels("control-plane", {NAME: "control-plane"}), [9090],
               ["a metrics scraper"], [w for w in everyone if w != "a metrics scraper"])
        expect("data plane proxy", role_labels("data-plane", {NAME: "data-plane"}), [8080],
               ["outside the cluster", "any pod of the namespace"], [])

    # --------------------------------------------------------------- services, references
    def check_services(self):
        for s in self.services:
            sel = (s.get("spec") or {}).get("selector")
            if not sel:
                continue
            pods = [d for d in self.workloads if all(pod_labels(d).get(k) == v for k, v in sel.items())]
            if not pods:
                self.err("services", ident(s), f"selector {sel} matches no pod")
                continue
            for p in (s.get("spec") or {}).get("ports") or []:
                tp = p.get("targetPort", p.get("port"))
                if isinstance(tp, str) and not tp.isdigit():
                    for d in pods:
                        names = {cp.get("name") for c in pod_spec(d).get("containers") or []
                                 for cp in c.get("ports") or []}
                        if tp not in names:
                            self.err("services", ident(s), f"targetPort {tp!r} is no port of {ident(d)}")

    def service_port(self, host, port):
        """True when `host` (short name or NAME.NAMESPACE[.svc…]) is a rendered Service with `port`."""
        parts = host.split(".")
        if len(parts) > 1 and parts[1] != self.namespace():
            return None  # another namespace or outside the cluster: not ours to check
        for s in self.services:
            if s["metadata"]["name"] == parts[0]:
                return any(p.get("port") == port for p in (s.get("spec") or {}).get("ports") or [])
        return False

    def check_url(self, where, url):
        if VAR_REF.search(url.split("@")[-1].split("/")[0]):
            return
        try:
            u = urlsplit(url)
            host, port = u.hostname, u.port
        except ValueError:
            self.err("references", where, f"unreadable URL {url!r}")
            return
        if not host or not re.match(r"^[a-z0-9-]+(\.[a-z0-9-]+)*$", host) or re.match(r"^[0-9.]+$", host):
            return
        if port is None:
            port = {"http": 80, "https": 443, "redis": 6379, "rediss": 6379}.get(u.scheme)
        ok = self.service_port(host, port)
        if ok is False:
            self.err("references", where, f"{url.split('@')[-1]}: no Service {host!r} with port {port}")

    def check_var_refs(self, where, c):
        """$(VAR) in env values, command and args: the kubelet expands only variables defined
        earlier in the same container's env; anything else stays literally `$(VAR)`."""
        defined = set()
        for e in c.get("env") or []:
            for ref in VAR_REF.findall(str(e.get("value") or "")):
                if ref[2:-1] not in defined:
                    self.err("references", where, f"env {e.get('name')} uses {ref}, which is not "
                             "defined before it in the container's env (it would stay literal)")
            defined.add(e.get("name"))
        for a in (c.get("command") or []) + (c.get("args") or []):
            for ref in VAR_REF.findall(str(a)):
                if ref[2:-1] not in defined:
                    self.err("references", where, f"argument {str(a)!r} uses {ref}, which the "
                             "container's env does not define")

    def check_references(self):
        for doc in self.workloads:
            for c, _ in all_containers(pod_spec(doc)):
                self.check_var_refs(f"{ident(doc)} container {c.get('name')}", c)
        url_options = {"data-plane": [("--control-plane", "DP_CONTROL_PLANE"), ("--jwks-url", "DP_JWKS_URL"),
                                      ("--redis-url", "DP_REDIS_URL")],
                       "auth-service": [("--redis-url", "AUTH_REDIS_URL")]}
        for binary, opts in url_options.items():
            for doc, c in self.gateway_workloads(binary):
                for flag, env in opts:
                    value, source = option(c, flag, env)
                    if value:
                        self.check_url(f"{ident(doc)} {flag}", value)
        for d in self.docs:
            if d.get("kind") != "ConfigMap":
                continue
            for key, text in (d.get("data") or {}).items():
                if not key.endswith(".json"):
                    continue
                try:
                    seed = json.loads(text)
                except ValueError as e:
                    self.err("references", f"{ident(d)} {key}", f"not JSON: {e}")
                    continue
                for up in seed.get("upstreams") or []:
                    for inst in up.get("instances") or []:
                        self.check_url(f"{ident(d)} upstream {up.get('name')}", inst.get("url", ""))
                    disc = up.get("discovery")
                    if disc and self.service_port(disc.get("dnsName", ""), disc.get("port")) is False:
                        self.err("references", f"{ident(d)} upstream {up.get('name')}",
                                 f"discovery name {disc.get('dnsName')!r} port {disc.get('port')} is no Service")


def check(docs, profile="base", flags_doc=None, example_secrets=None):
    """Every breach, as `[rule] where: message` strings (empty: all rules hold)."""
    return Checker(copy.deepcopy(docs), profile, flags_doc, example_secrets).run()


def load_example_secrets(paths):
    """{secret name: set of keys} from example Secret manifests."""
    out = {}
    for path in paths:
        for d in load_documents(path):
            if d.get("kind") == "Secret":
                keys = set((d.get("stringData") or {}).keys()) | set((d.get("data") or {}).keys())
                out.setdefault(d["metadata"]["name"], set()).update(keys)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rendered", help="output of kubectl kustomize")
    ap.add_argument("--profile", choices=("base", "demo", "ha"), default="base")
    ap.add_argument("--flags-doc", help="docs/flags.md: check every flag and variable against it")
    ap.add_argument("--secrets", action="append", default=None, metavar="EXAMPLE.yaml",
                    help="an example Secret manifest (repeatable): every secretKeyRef must name "
                         "one of their Secrets and keys")
    a = ap.parse_args(argv)
    flags_doc = open(a.flags_doc, encoding="utf-8").read() if a.flags_doc else None
    secrets = load_example_secrets(a.secrets) if a.secrets is not None else None
    docs = load_documents(a.rendered)
    errors = check(docs, a.profile, flags_doc, secrets)
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    if errors:
        print(f"{a.rendered}: {len(errors)} rule breaches", file=sys.stderr)
        return 1
    pods = sum(1 for d in docs if d.get("kind") in WORKLOAD_KINDS)
    print(f"  {a.rendered}: {len(docs)} objects, {pods} workloads: every rule holds (profile {a.profile})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
