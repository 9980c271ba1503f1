#!/usr/bin/env python3
"""Checks deploy/*.yaml without a cluster.

1. Every core resource against the Kubernetes OpenAPI schemas bundled in the
   `kubernetes-validate` package (strict: unknown fields are errors), for the oldest and the
   newest Kubernetes versions named below. Offline: the schemas ship inside the package.
2. The Prometheus Operator resources (PodMonitor, ServiceMonitor), which that package has no
   schema for, against the fields they may use here (monitoring.schema.json, written for this
   check from the operator's API reference: a subset, strict).
3. What no schema sees: the selectors and port names that tie the pieces together, the probes on
   /health, the GPU request, and the shutdown timing (preStop sleep + Tandem's drain must fit
   in terminationGracePeriodSeconds).

With --self-test it also breaks copies of the manifests in known ways and checks that each
break is caught. Exit status 1 on any problem.
"""

import copy
import glob
import json
import os
import sys

import jsonschema
import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The oldest version the manifests need (the preStop `sleep` action is on by default from
# 1.30) and the newest the installed schemas know.
VERSIONS = ["1.30.0", kubernetes_validate.utils.latest_version()]
CRD_KINDS = {"PodMonitor", "ServiceMonitor"}


def load(deploy_dir):
    docs = []
    for path in sorted(glob.glob(os.path.join(deploy_dir, "*.yaml"))):
        with open(path) as f:
            for d in yaml.safe_load_all(f):
                if d:
                    docs.append((os.path.basename(path), d))
    return docs


def schema_errors(docs):
    errs = []
    with open(os.path.join(HERE, "monitoring.schema.json")) as f:
        crd_schemas = json.load(f)
    for fname, d in docs:
        name = f"{fname}: {d.get('kind')}/{d.get('metadata', {}).get('name')}"
        if d.get("kind") in CRD_KINDS:
            try:
                jsonschema.validate(d, crd_schemas[d["kind"]])
            except jsonschema.ValidationError as e:
                errs.append(f"{name}: {e.message} at {list(e.absolute_path)}")
            continue
        for v in VERSIONS:
            try:
                kubernetes_validate.validate(d, v, strict=True)
            except kubernetes_validate.ValidationError as e:
                errs.append(f"{name} (Kubernetes {v}): {e.message} at {list(e.path)}")
            except kubernetes_validate.SchemaNotFoundError:
                errs.append(f"{name}: no schema for it in Kubernetes {v}")
    return errs


def find(docs, kind, name):
    for _, d in docs:
        if d.get("kind") == kind and d["metadata"]["name"] == name:
            return d
    return None


def flag(args, name):
    return args[args.index(name) + 1] if name in args else None


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def consistency_errors(docs):
    errs = []
    worker = find(docs, "Deployment", "tandem-worker")
    router = find(docs, "Deployment", "tandem-router")
    if not worker or not router:
        return ["deploy/ needs the Deployments tandem-worker and tandem-router"]
    wpod = worker["spec"]["template"]
    wlabels = wpod["metadata"]["labels"]
    if not matches(worker["spec"]["selector"]["matchLabels"], wlabels):
        errs.append("tandem-worker: its selector does not match its pod labels")
    c = wpod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    args = [str(a) for a in c.get("args", [])]
    if str(ports.get("http")) != flag(args, "--port"):
        errs.append(f"tandem-worker: the container port `http` ({ports.get('http')}) is not the --port Tandem listens on ({flag(args, '--port')})")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(probe, {}).get("httpGet", {})
        if p.get("path") != "/health" or p.get("port") not in ("http", ports.get("http")):
            errs.append(f"tandem-worker: {probe} must GET /health on the http port (has {p})")
    gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
    if not gpus or int(gpus) < 1:
        errs.append("tandem-worker: no nvidia.com/gpu limit")
    grace = int(flag(args, "--shutdown-grace-s") or 30)
    pre = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    tgp = wpod["spec"].get("terminationGracePeriodSeconds", 30)
    if tgp < pre + grace + 5:
        errs.append(f"tandem-worker: terminationGracePeriodSeconds {tgp} < preStop sleep {pre} + --shutdown-grace-s {grace} + 5: the kubelet would SIGKILL the drain")
    # The router finds the workers by label and port.
    rc = router["spec"]["template"]["spec"]["containers"][0]
    rargs = [str(a) for a in rc.get("args", [])]
    sel = flag(rargs, "--selector")
    if "--service-discovery" not in rargs or not sel:
        errs.append("tandem-router: no --service-discovery --selector")
    else:
        k, _, v = sel.partition("=")
        if wlabels.get(k) != v:
            errs.append(f"tandem-router: --selector {sel} does not select the worker pods ({wlabels})")
    if flag(rargs, "--service-discovery-port") != str(ports.get("http")):
        errs.append(f"tandem-router: --service-discovery-port {flag(rargs, '--service-discovery-port')} is not the workers' port {ports.get('http')}")
    sa = router["spec"]["template"]["spec"].get("serviceAccountName")
    rb = find(docs, "RoleBinding", "tandem-router")
    if not rb or sa not in [s["name"] for s in rb["subjects"]]:
        errs.append("tandem-router: its service account is not bound to the pod-watching Role")
    rlabels = router["spec"]["template"]["metadata"]["labels"]
    rports = {p["name"] for p in rc.get("ports", [])}
    # Services and monitors select what they should.
    for _, d in docs:
        kind, name = d.get("kind"), d["metadata"]["name"]
        if kind == "Service":
            target = wlabels if name == "tandem-worker" else rlabels
            if not matches(d["spec"]["selector"], target):
                errs.append(f"Service {name}: its selector matches no pod of its Deployment")
            names = set(ports) if name == "tandem-worker" else rports
            for p in d["spec"]["ports"]:
                if p["targetPort"] not in names:
                    errs.append(f"Service {name}: targetPort {p['targetPort']} is no container port name")
        if kind == "PodMonitor":
            if not matches(d["spec"]["selector"]["matchLabels"], wlabels):
                errs.append(f"PodMonitor {name}: selects no worker pod")
            for e in d["spec"]["podMetricsEndpoints"]:
                if e["port"] not in ports:
                    errs.append(f"PodMonitor {name}: port {e['port']} is no worker container port")
        if kind == "ServiceMonitor":
            svc = find(docs, "Service", "tandem-router")
            if not svc or not matches(d["spec"]["selector"]["matchLabels"], svc["metadata"].get("labels", {})):
                errs.append(f"ServiceMonitor {name}: selects no Service")
            elif any(e["port"] not in {p["name"] for p in svc["spec"]["ports"]} for e in d["spec"]["endpoints"]):
                errs.append(f"ServiceMonitor {name}: an endpoint port is not a port of Service tandem-router")
    return errs


def check(docs):
    # The cross-checks read fields the schemas vouch for: only once they pass.
    return schema_errors(docs) or consistency_errors(docs)


def self_test(docs):
    """Each break must be caught: how many were tried, and those missed."""

    def broken(f):
        d = copy.deepcopy(docs)
        f(d)
        return d

    def worker(d):
        return find(d, "Deployment", "tandem-worker")["spec"]["template"]["spec"]

    cases = {
        "an unknown field": lambda d: worker(d)["containers"][0].__setitem__("readinessProbes", {}),
        "a wrong type": lambda d: worker(d).__setitem__("terminationGracePeriodSeconds", "75"),
        "a grace period shorter than the drain": lambda d: worker(d).__setitem__("terminationGracePeriodSeconds", 20),
        "a probe off /health": lambda d: worker(d)["containers"][0]["readinessProbe"]["httpGet"].__setitem__("path", "/v1/models"),
        "no GPU": lambda d: worker(d)["containers"][0]["resources"]["limits"].pop("nvidia.com/gpu"),
        "a router selector matching nothing": lambda d: find(d, "Deployment", "tandem-router")["spec"]["template"]["spec"]["containers"][0]["args"].__setitem__(
            find(d, "Deployment", "tandem-router")["spec"]["template"]["spec"]["containers"][0]["args"].index("--selector") + 1, "app=nothing"),
        "a PodMonitor on a missing port": lambda d: find(d, "PodMonitor", "tandem-worker")["spec"]["podMetricsEndpoints"][0].__setitem__("port", "metrics"),
        "a PodMonitor with a misspelt field": lambda d: find(d, "PodMonitor", "tandem-worker")["spec"].__setitem__("podMetricEndpoints", []),
    }
    missed = []
    for what, f in cases.items():
        errs = check(broken(f))
        print(f"  self-test: {what}: {'caught: ' + errs[0] if errs else 'NOT CAUGHT'}")
        if not errs:
            missed.append(what)
    return len(cases), missed


def main():
    deploy = os.path.join(ROOT, "deploy")
    docs = load(deploy)
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for _, d in docs)
    errs = check(docs)
    print(f"deploy/: {len(docs)} resources ({', '.join(kinds)}) against Kubernetes {' and '.join(VERSIONS)}: {len(errs)} problems")
    for e in errs:
        print(f"  {e}")
    breaks, missed = self_test(docs) if "--self-test" in sys.argv else (0, [])
    if missed:
        print(f"self-test: these breaks were not caught: {missed}")
    # The count `cargo xtask test` adds to its closing line: deploy/ valid, and each break caught.
    print(f"validate_deploy: {int(not errs) + breaks - len(missed)} passed, {int(bool(errs)) + len(missed)} failed, 0 skipped")
    sys.exit(1 if errs or missed else 0)


if __name__ == "__main__":
    main()
