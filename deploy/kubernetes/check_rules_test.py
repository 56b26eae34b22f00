#!/usr/bin/env python3
"""Tests of check_rules.py: the rendered manifests pass, and each deliberately broken copy of
them fails with the rule that was broken (a checker that cannot fail proves nothing).

    python3 deploy/kubernetes/check_rules_test.py [-v]

Renders the base and the overlays with `kubectl kustomize`, or reads base.yaml, demo.yaml and
ha.yaml from $CHECK_RULES_RENDERED (scripts/check-kubernetes passes the files it has just
rendered). Standard library unittest plus PyYAML.
"""

import copy
import os
import subprocess
import sys
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in deploy/kubernetes
import check_rules  # noqa: E402

RENDER = {"base": HERE, "demo": os.path.join(HERE, "overlays", "demo"),
          "ha": os.path.join(HERE, "overlays", "ha")}
SECRETS = {"base": [os.path.join(HERE, "secrets.example.yaml")],
           "demo": [os.path.join(HERE, "secrets.example.yaml"),
                    os.path.join(HERE, "overlays", "demo", "secrets.example.yaml")],
           "ha": [os.path.join(HERE, "secrets.example.yaml"),
                  os.path.join(HERE, "overlays", "ha", "secrets.example.yaml")]}


def render(profile):
    rendered = os.environ.get("CHECK_RULES_RENDERED")
    if rendered:
        with open(os.path.join(rendered, f"{profile}.yaml"), encoding="utf-8") as f:
            text = f.read()
    else:
        text = subprocess.run(["kubectl", "kustomize", RENDER[profile]], check=True,
                              capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(text) if d]


class Manifests:
    """A deep copy of one rendered profile, with accessors for mutating it."""

    def __init__(self, docs):
        self.docs = copy.deepcopy(docs)

    def get(self, kind, name):
        for d in self.docs:
            if d.get("kind") == kind and d["metadata"]["name"] == name:
                return d
        raise KeyError(f"{kind}/{name}")

    def remove(self, kind, name):
        self.docs.remove(self.get(kind, name))

    def pod(self, kind, name):
        return check_rules.pod_spec(self.get(kind, name))

    def container(self, kind, name, index=0):
        return self.pod(kind, name)["containers"][index]

    def env(self, kind, name, var):
        for e in self.container(kind, name)["env"]:
            if e["name"] == var:
                return e
        raise KeyError(var)


class CheckRulesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rendered = {p: render(p) for p in RENDER}
        with open(os.path.join(ROOT, "docs", "flags.md"), encoding="utf-8") as f:
            cls.flags_doc = f.read()
        cls.secrets = {p: check_rules.load_example_secrets(paths) for p, paths in SECRETS.items()}

    def manifests(self, profile="base"):
        return Manifests(self.rendered[profile])

    def errors(self, m, profile="base"):
        return check_rules.check(m.docs, profile, self.flags_doc, self.secrets[profile])

    def assertCaught(self, m, rule, fragment="", profile="base"):
        errors = self.errors(m, profile)
        hits = [e for e in errors if e.startswith(f"[{rule}]") and fragment in e]
        self.assertTrue(hits, f"expected a [{rule}] error containing {fragment!r}; got:\n  "
                        + "\n  ".join(errors or ["(no error at all)"]))

    # ------------------------------------------------------------------ the real thing
    def test_rendered_manifests_pass(self):
        for profile in RENDER:
            with self.subTest(profile=profile):
                self.assertEqual(self.errors(self.manifests(profile), profile), [])

    def test_nothing_rendered_is_caught(self):
        self.assertCaught(Manifests([]), "data-plane-autoscaling", "no data-plane workload")

    # ------------------------------------------------------------------ workloads
    def test_job(self):
        m = self.manifests()
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "migrate", "namespace": "gateway"},
               "spec": {"template": {"spec": copy.deepcopy(m.pod("Deployment", "users-1"))}}}
        m.docs.append(job)
        self.assertCaught(m, "one-shot", "Job/migrate")

    def test_missing_readiness_probe(self):
        m = self.manifests()
        del m.container("Deployment", "data-plane")["readinessProbe"]
        self.assertCaught(m, "probes", "Deployment/data-plane container data-plane: no readinessProbe")

    def test_missing_liveness_probe(self):
        m = self.manifests()
        del m.container("Deployment", "redis")["livenessProbe"]
        self.assertCaught(m, "probes", "Deployment/redis container redis: no livenessProbe")

    def test_sidecar_init_container_without_probes(self):
        m = self.manifests()
        side = copy.deepcopy(m.container("Deployment", "users-1"))
        side.update(name="sidecar", restartPolicy="Always")
        del side["readinessProbe"]
        m.pod("Deployment", "users-1")["initContainers"] = [side]
        self.assertCaught(m, "probes", "container sidecar: no readinessProbe")

    def test_init_container_without_limits_or_hardening(self):
        m = self.manifests()
        m.pod("Deployment", "users-1")["initContainers"] = [
            {"name": "setup", "image": "busybox", "command": ["true"]}]
        self.assertCaught(m, "resources", "container setup: no limits.memory")
        self.assertCaught(m, "read-only-root", "container setup")
        self.assertCaught(m, "privilege-escalation", "container setup")
        self.assertCaught(m, "capabilities", "container setup")

    def test_missing_memory_limit(self):
        m = self.manifests()
        del m.container("Deployment", "auth-service")["resources"]["limits"]["memory"]
        self.assertCaught(m, "resources", "no limits.memory")

    def test_missing_cpu_request(self):
        m = self.manifests()
        del m.container("StatefulSet", "control-plane")["resources"]["requests"]["cpu"]
        self.assertCaught(m, "resources", "no requests.cpu")

    def test_request_above_limit(self):
        m = self.manifests()
        m.container("Deployment", "data-plane")["resources"]["requests"]["memory"] = "1Gi"
        self.assertCaught(m, "resources", "memory request 1Gi is above its limit")

    def test_root_allowed(self):
        m = self.manifests()
        m.pod("Deployment", "users-1")["securityContext"]["runAsNonRoot"] = False
        self.assertCaught(m, "non-root", "Deployment/users-1")

    def test_uid_zero(self):
        m = self.manifests()
        m.container("Deployment", "orders")["securityContext"]["runAsUser"] = 0
        self.assertCaught(m, "non-root", "runAsUser is 0")

    def test_named_user_only(self):
        m = self.manifests()
        del m.pod("Deployment", "redis")["securityContext"]["runAsUser"]
        self.assertCaught(m, "non-root", "runAsUser is None")

    def test_writable_root(self):
        m = self.manifests()
        m.container("Deployment", "auth-service")["securityContext"]["readOnlyRootFilesystem"] = False
        self.assertCaught(m, "read-only-root", "Deployment/auth-service")

    def test_privilege_escalation(self):
        m = self.manifests()
        m.container("Deployment", "data-plane")["securityContext"]["allowPrivilegeEscalation"] = True
        self.assertCaught(m, "privilege-escalation", "allowPrivilegeEscalation")

    def test_privileged(self):
        m = self.manifests()
        m.container("Deployment", "data-plane")["securityContext"]["privileged"] = True
        self.assertCaught(m, "privilege-escalation", "privileged")

    def test_capabilities_kept(self):
        m = self.manifests()
        m.container("Deployment", "redis")["securityContext"]["capabilities"] = {"drop": ["NET_RAW"]}
        self.assertCaught(m, "capabilities", "does not hold ALL")

    def test_capability_added(self):
        m = self.manifests()
        m.container("Deployment", "redis")["securityContext"]["capabilities"]["add"] = ["NET_ADMIN"]
        self.assertCaught(m, "capabilities", "NET_ADMIN")

    def test_no_seccomp(self):
        m = self.manifests()
        del m.pod("StatefulSet", "control-plane")["securityContext"]["seccompProfile"]
        self.assertCaught(m, "seccomp", "StatefulSet/control-plane")

    def test_unconfined_seccomp(self):
        m = self.manifests()
        m.container("Deployment", "users-1")["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
        self.assertCaught(m, "seccomp", "Unconfined")

    def test_host_path_and_network(self):
        m = self.manifests()
        pod = m.pod("Deployment", "data-plane")
        pod["volumes"].append({"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}})
        pod["hostNetwork"] = True
        self.assertCaught(m, "pod-security", "hostPath")
        self.assertCaught(m, "pod-security", "hostNetwork")

    def test_service_account_token(self):
        m = self.manifests()
        del m.pod("Deployment", "orders")["automountServiceAccountToken"]
        self.assertCaught(m, "service-account-token", "Deployment/orders")

    # ------------------------------------------------------------------ secrets
    def test_inline_token(self):
        m = self.manifests()
        e = m.env("Deployment", "data-plane", "DP_CONTROL_PLANE_TOKEN")
        del e["valueFrom"]
        e["value"] = "0123456789abcdef0123456789abcdef"
        self.assertCaught(m, "inline-secret", "env DP_CONTROL_PLANE_TOKEN")

    def test_inline_password(self):
        m = self.manifests()
        e = m.env("Deployment", "redis", "GATEWAY_REDIS_PASSWORD")
        del e["valueFrom"]
        e["value"] = "hunter2hunter2hunter2hunter2hunter2"
        self.assertCaught(m, "inline-secret", "env GATEWAY_REDIS_PASSWORD")

    def test_password_in_url(self):
        m = self.manifests()
        m.env("Deployment", "auth-service", "AUTH_REDIS_URL")["value"] = "redis://:hunter2@redis:6379"
        self.assertCaught(m, "inline-secret", "env AUTH_REDIS_URL holds a URL with a password")

    def test_password_in_url_argument(self):
        m = self.manifests()
        m.container("Deployment", "data-plane")["args"].append("--redis-url=redis://app:hunter2@redis:6379")
        self.assertCaught(m, "inline-secret", "URL with a password")

    def test_token_flag(self):
        m = self.manifests()
        m.container("Deployment", "data-plane")["args"] += ["--control-plane-token", "abcdef0123456789"]
        self.assertCaught(m, "inline-secret", "--control-plane-token is given a secret")

    def test_seed_users_inline(self):
        m = self.manifests("demo")
        e = m.env("Deployment", "auth-service", "GATEWAY_SEED_USERS")
        del e["valueFrom"]
        e["value"] = "alice:wonderland:user"
        self.assertCaught(m, "inline-secret", "env GATEWAY_SEED_USERS", profile="demo")

    def test_secret_in_configmap(self):
        m = self.manifests()
        m.docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "gateway"},
                       "data": {"admin-token": "abc"}})
        self.assertCaught(m, "inline-secret", "ConfigMap key 'admin-token'")

    def test_rendered_secret(self):
        m = self.manifests()
        m.docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gateway-tokens"},
                       "stringData": {"admin-token": "x"}})
        self.assertCaught(m, "secret-in-manifests", "Secret/gateway-tokens")

    def test_unknown_secret_key(self):
        m = self.manifests()
        m.env("Deployment", "data-plane", "DP_CONTROL_PLANE_TOKEN")["valueFrom"]["secretKeyRef"]["key"] = "dp-token"
        self.assertCaught(m, "secret-refs", "no key 'dp-token'")

    def test_unknown_secret(self):
        m = self.manifests()
        m.env("Deployment", "auth-service", "GATEWAY_REDIS_PASSWORD")["valueFrom"]["secretKeyRef"]["name"] = "redis-pw"
        self.assertCaught(m, "secret-refs", "Secret 'redis-pw' is in no secrets example")

    # ------------------------------------------------------------------ gateway binaries
    def test_command_skips_entrypoint(self):
        m = self.manifests()
        m.container("StatefulSet", "control-plane")["command"] = ["control-plane"]
        self.assertCaught(m, "entrypoint", "StatefulSet/control-plane")

    def test_unknown_flag(self):
        m = self.manifests()
        m.container("Deployment", "data-plane")["args"].append("--cache-directory=/var/cache/gateway")
        self.assertCaught(m, "flags", "no flag --cache-directory")

    def test_flag_of_another_binary(self):
        m = self.manifests()
        m.container("Deployment", "auth-service")["args"].append("--drain-delay-ms=5000")
        self.assertCaught(m, "flags", "auth-service takes no flag --drain-delay-ms")

    def test_unknown_variable(self):
        m = self.manifests()
        m.container("Deployment", "data-plane")["env"].append({"name": "DP_DRAIN_DELAY", "value": "5000"})
        self.assertCaught(m, "flags", "DP_DRAIN_DELAY is not one")

    def test_variable_of_another_binary(self):
        m = self.manifests()
        m.container("Deployment", "auth-service")["env"].append({"name": "DP_CACHE_DIR", "value": "/tmp"})
        self.assertCaught(m, "flags", "DP_CACHE_DIR is not one docs/flags.md lists for auth-service")

    def test_cache_dir_not_mounted(self):
        m = self.manifests()
        m.container("Deployment", "data-plane")["volumeMounts"] = []
        self.assertCaught(m, "writable", "--cache-dir /var/cache/gateway is on the read-only root")

    def test_cache_dir_read_only(self):
        m = self.manifests()
        m.container("Deployment", "data-plane")["volumeMounts"][0]["readOnly"] = True
        self.assertCaught(m, "writable", "--cache-dir")

    def test_database_on_a_configmap(self):
        m = self.manifests()
        pod = m.pod("StatefulSet", "control-plane")
        pod["containers"][0]["args"] = [a if not a.startswith("--database=") else
                                        "--database=/etc/gateway/seed/cp.db" for a in pod["containers"][0]["args"]]
        self.assertCaught(m, "writable", "volume 'seed'")

    def test_key_dir_unmounted(self):
        m = self.manifests()
        args = m.container("Deployment", "auth-service")["args"]
        args[args.index("--key-dir=/var/lib/gateway/keys")] = "--key-dir=/etc/keys"
        self.assertCaught(m, "writable", "--key-dir /etc/keys")

    def test_flag_given_twice(self):
        m = self.manifests()
        m.container("Deployment", "auth-service")["args"].append("--key-dir=/etc/keys")
        self.assertCaught(m, "flags", "--key-dir is given twice")

    def test_tokens_file_on_root(self):
        m = self.manifests()
        m.env("StatefulSet", "control-plane", "GATEWAY_TOKENS_FILE")["value"] = "/etc/gateway/auth-tokens"
        self.assertCaught(m, "writable", "GATEWAY_TOKENS_FILE")

    def test_wrong_readiness_path(self):
        m = self.manifests()
        m.container("Deployment", "data-plane")["readinessProbe"]["httpGet"]["path"] = "/healthz"
        self.assertCaught(m, "probe-paths", "serves /readyz on port 9901")

    def test_probe_on_proxy_port(self):
        m = self.manifests()
        m.container("Deployment", "data-plane")["livenessProbe"]["httpGet"]["port"] = "http"
        self.assertCaught(m, "probe-paths", "serves /healthz on port 9901")

    def test_auth_probe_on_readyz(self):
        m = self.manifests()
        m.container("Deployment", "auth-service")["readinessProbe"]["httpGet"]["path"] = "/readyz"
        self.assertCaught(m, "probe-paths", "auth-service serves /healthz")

    def test_control_plane_http_probe(self):
        m = self.manifests()
        m.container("StatefulSet", "control-plane")["livenessProbe"] = {"httpGet": {"path": "/healthz", "port": 9090}}
        self.assertCaught(m, "probe-paths", "tcpSocket probe on port 50051")

    def test_control_plane_grpc_probe_over_tls(self):
        # The manifests serve TLS: the kubelet's cleartext gRPC probe would fail every time.
        m = self.manifests()
        m.container("StatefulSet", "control-plane")["readinessProbe"] = {"grpc": {"port": 50051}}
        self.assertCaught(m, "probe-paths", "cannot speak TLS")

    def test_control_plane_cleartext_needs_the_grpc_probe(self):
        m = self.manifests()
        c = m.container("StatefulSet", "control-plane")
        c["args"] = [a for a in c["args"] if not a.startswith("--tls-")]
        self.assertCaught(m, "probe-paths", "gRPC health probe on port 50051")

    def test_loopback_listener(self):
        m = self.manifests()
        args = m.container("Deployment", "data-plane")["args"]
        args[args.index("--admin-listen=0.0.0.0:9901")] = "--admin-listen=127.0.0.1:9901"
        self.assertCaught(m, "probe-paths", "loopback")

    # ------------------------------------------------------------------ replicas, autoscaling
    def test_sqlite_control_plane_scaled(self):
        m = self.manifests()
        m.get("StatefulSet", "control-plane")["spec"]["replicas"] = 2
        self.assertCaught(m, "sqlite-single-writer", "control-plane on SQLite with 2 replicas")

    def test_sqlite_auth_rolling_update(self):
        m = self.manifests()
        m.get("Deployment", "auth-service")["spec"]["strategy"] = {"type": "RollingUpdate"}
        self.assertCaught(m, "sqlite-single-writer", "Recreate")

    def test_no_hpa(self):
        m = self.manifests()
        m.remove("HorizontalPodAutoscaler", "data-plane")
        self.assertCaught(m, "data-plane-autoscaling", "no HorizontalPodAutoscaler")

    def test_hpa_targets_something_else(self):
        m = self.manifests()
        m.get("HorizontalPodAutoscaler", "data-plane")["spec"]["scaleTargetRef"]["name"] = "data-planes"
        self.assertCaught(m, "data-plane-autoscaling", "no HorizontalPodAutoscaler")

    def test_hpa_without_cpu(self):
        m = self.manifests()
        h = m.get("HorizontalPodAutoscaler", "data-plane")
        h["spec"]["metrics"][0]["resource"]["name"] = "memory"
        self.assertCaught(m, "data-plane-autoscaling", "no CPU resource metric")

    def test_hpa_old_api(self):
        m = self.manifests()
        m.get("HorizontalPodAutoscaler", "data-plane")["apiVersion"] = "autoscaling/v1"
        self.assertCaught(m, "data-plane-autoscaling", "not autoscaling/v2")

    def test_replicas_outside_hpa_range(self):
        m = self.manifests()
        m.get("Deployment", "data-plane")["spec"]["replicas"] = 50
        self.assertCaught(m, "data-plane-autoscaling", "outside the autoscaler's")

    def test_no_pdb(self):
        m = self.manifests()
        m.remove("PodDisruptionBudget", "data-plane")
        self.assertCaught(m, "data-plane-autoscaling", "no PodDisruptionBudget")

    def test_pdb_selects_other_pods(self):
        m = self.manifests()
        m.get("PodDisruptionBudget", "data-plane")["spec"]["selector"]["matchLabels"] = {"app": "dp"}
        self.assertCaught(m, "data-plane-autoscaling", "no PodDisruptionBudget")

    def test_ha_two_data_planes(self):
        m = self.manifests("ha")
        m.get("Deployment", "data-plane")["spec"]["replicas"] = 2
        self.assertCaught(m, "replicas", "replicas 2: HA needs 3", profile="ha")

    def test_ha_hpa_minimum(self):
        m = self.manifests("ha")
        m.get("HorizontalPodAutoscaler", "data-plane")["spec"]["minReplicas"] = 2
        self.assertCaught(m, "replicas", "minReplicas 2", profile="ha")

    def test_ha_single_control_plane(self):
        m = self.manifests("ha")
        m.get("Deployment", "control-plane")["spec"]["replicas"] = 1
        self.assertCaught(m, "replicas", "2 or more control planes", profile="ha")

    def test_base_is_not_ha(self):
        # The same rules that the HA overlay passes fail on the base's 2 data planes.
        self.assertCaught(self.manifests(), "replicas", "HA needs 3", profile="ha")

    # ------------------------------------------------------------------ drain
    def test_no_prestop(self):
        m = self.manifests()
        del m.container("Deployment", "data-plane")["lifecycle"]
        self.assertCaught(m, "drain", "no preStop sleep")

    def test_no_drain_delay(self):
        m = self.manifests()
        m.env("Deployment", "data-plane", "DP_DRAIN_DELAY_MS")["value"] = "0"
        self.assertCaught(m, "drain", "--drain-delay-ms is 0")

    def test_grace_too_short(self):
        m = self.manifests()
        m.pod("Deployment", "data-plane")["terminationGracePeriodSeconds"] = 15
        self.assertCaught(m, "drain", "terminationGracePeriodSeconds 15 < preStop 5 s")

    def test_drain_flag_counts(self):
        m = self.manifests()
        m.container("Deployment", "data-plane")["args"].append("--drain-delay-ms=60000")
        self.assertCaught(m, "drain", "drain 60000 ms")

    def test_native_sleep_action_counts(self):
        m = self.manifests()
        m.container("Deployment", "data-plane")["lifecycle"]["preStop"] = {"sleep": {"seconds": 40}}
        self.assertCaught(m, "drain", "preStop 40 s")

    # ------------------------------------------------------------------ network policies
    def test_no_redis_policy(self):
        m = self.manifests()
        m.remove("NetworkPolicy", "redis")
        m.remove("NetworkPolicy", "default-deny-ingress")
        self.assertCaught(m, "network-policy", "Redis port 6379: an upstream can connect")

    def test_redis_closed_to_data_planes(self):
        m = self.manifests()
        m.remove("NetworkPolicy", "redis")
        self.assertCaught(m, "network-policy", "Redis port 6379: data planes cannot connect")

    def test_redis_open_to_everyone(self):
        m = self.manifests()
        del m.get("NetworkPolicy", "redis")["spec"]["ingress"][0]["from"]
        self.assertCaught(m, "network-policy", "Redis port 6379: any pod of the namespace can connect")

    def test_redis_open_to_other_namespaces(self):
        m = self.manifests()
        m.get("NetworkPolicy", "redis")["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}})
        self.assertCaught(m, "network-policy", "a pod of another namespace can connect")

    def test_redis_open_to_an_address_block(self):
        m = self.manifests()
        m.get("NetworkPolicy", "redis")["spec"]["ingress"][0]["from"].append({"ipBlock": {"cidr": "10.0.0.0/8"}})
        self.assertCaught(m, "network-policy", "Redis port 6379: outside the cluster can connect")

    def test_upstreams_open_to_auth_service(self):
        m = self.manifests()
        m.get("NetworkPolicy", "upstreams")["spec"]["ingress"][0]["from"].append(
            {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "auth-service"}}})
        self.assertCaught(m, "network-policy", "upstreams port 7001: the auth service can connect")

    def test_no_upstream_policy(self):
        m = self.manifests()
        m.remove("NetworkPolicy", "upstreams")
        m.remove("NetworkPolicy", "default-deny-ingress")
        self.assertCaught(m, "network-policy", "upstreams port 7002: any pod of the namespace can connect")

    def test_upstream_policy_for_mocks_only(self):
        # A policy that protects today's mocks but not backends labelled as upstreams later.
        m = self.manifests()
        m.remove("NetworkPolicy", "default-deny-ingress")
        m.get("NetworkPolicy", "upstreams")["spec"]["podSelector"] = {
            "matchLabels": {"app.kubernetes.io/name": "mock-service"}}
        self.assertCaught(m, "network-policy", "upstreams port 80: any pod of the namespace can connect")

    def test_auth_service_open(self):
        m = self.manifests()
        m.get("NetworkPolicy", "auth-service")["spec"]["ingress"][0]["from"] = []
        self.assertCaught(m, "network-policy", "auth service port 4000: an upstream can connect")

    def test_control_plane_open(self):
        m = self.manifests()
        m.get("NetworkPolicy", "control-plane")["spec"]["ingress"][0]["from"] = []
        self.assertCaught(m, "network-policy", "control plane gRPC port 50051: any pod of the namespace can connect")

    def test_control_plane_closed_to_operators(self):
        m = self.manifests()
        m.get("NetworkPolicy", "control-plane")["spec"]["ingress"][0]["from"].pop()
        self.assertCaught(m, "network-policy", "an operator pod cannot connect")

    def test_scrapers_of_any_namespace(self):
        # Issue 41, item 17: the scraper's namespace is pinned, not only its label.
        m = self.manifests()
        m.get("NetworkPolicy", "data-plane")["spec"]["ingress"][1]["from"][0]["namespaceSelector"] = {}
        self.assertCaught(m, "network-policy",
                          "data plane ops listener port 9901: a scraper-labelled pod of another namespace can connect")
        m = self.manifests()
        m.get("NetworkPolicy", "control-plane")["spec"]["ingress"][1]["from"][0]["namespaceSelector"] = {}
        self.assertCaught(m, "network-policy",
                          "control plane metrics port 9090: a scraper-labelled pod of another namespace can connect")

    def test_ops_port_open(self):
        m = self.manifests()
        del m.get("NetworkPolicy", "data-plane")["spec"]["ingress"][0]["ports"]
        self.assertCaught(m, "network-policy", "data plane ops listener port 9901: outside the cluster can connect")

    def test_front_door_closed(self):
        m = self.manifests()
        m.get("NetworkPolicy", "data-plane")["spec"]["ingress"].pop(0)
        self.assertCaught(m, "network-policy", "data plane proxy port 8080: outside the cluster cannot connect")

    def test_ha_sentinel_port_closed(self):
        m = self.manifests("ha")
        m.get("NetworkPolicy", "redis")["spec"]["ingress"][0]["ports"].pop()
        self.assertCaught(m, "network-policy", "Redis port 26379: data planes cannot connect", profile="ha")

    # ------------------------------------------------------------------ services, references
    def test_service_selects_nothing(self):
        m = self.manifests()
        m.get("Service", "redis")["spec"]["selector"] = {"app.kubernetes.io/name": "redis-server"}
        self.assertCaught(m, "services", "Service/redis")

    def test_service_unknown_target_port(self):
        m = self.manifests()
        m.get("Service", "data-plane")["spec"]["ports"][0]["targetPort"] = "proxy"
        self.assertCaught(m, "services", "targetPort 'proxy'")

    def test_control_plane_url_to_nothing(self):
        m = self.manifests()
        args = m.container("Deployment", "data-plane")["args"]
        args[args.index("--control-plane=https://control-plane:50051")] = "--control-plane=https://controlplane:50051"
        self.assertCaught(m, "references", "no Service 'controlplane'")

    def test_jwks_url_wrong_port(self):
        m = self.manifests()
        args = m.container("Deployment", "data-plane")["args"]
        i = [j for j, a in enumerate(args) if a.startswith("--jwks-url=")][0]
        args[i] = "--jwks-url=http://auth-service:8080/.well-known/jwks.json"
        self.assertCaught(m, "references", "no Service 'auth-service' with port 8080")

    def test_seed_names_missing_service(self):
        m = self.manifests()
        m.remove("Service", "users-1")
        m.remove("Deployment", "users-1")
        self.assertCaught(m, "references", "upstream users")

    def test_var_ref_before_definition(self):
        m = self.manifests()
        env = m.container("Deployment", "data-plane")["env"]
        pw = [e for e in env if e["name"] == "GATEWAY_REDIS_PASSWORD"][0]
        env.remove(pw)
        env.append(pw)
        self.assertCaught(m, "references", "env DP_REDIS_URL uses $(GATEWAY_REDIS_PASSWORD)")

    def test_var_ref_undefined(self):
        m = self.manifests()
        m.env("Deployment", "auth-service", "AUTH_REDIS_URL")["value"] = "redis://:$(REDIS_PASSWORD)@redis:6379"
        self.assertCaught(m, "references", "$(REDIS_PASSWORD)")

    def test_seed_discovery_missing_service(self):
        m = self.manifests()
        m.remove("Service", "orders")
        self.assertCaught(m, "references", "discovery name 'orders'")


if __name__ == "__main__":
    unittest.main()
