#!/usr/bin/env python3
"""Re-vendor etcd's v3 API protos into proto/etcd/ (see proto/etcd/README.md).

Usage: scripts/vendor-etcd-protos.py ETCD_GIT_DIR TAG

Reads each file with `git --git-dir=ETCD_GIT_DIR show TAG:PATH` and writes it under
proto/etcd/<PATH>, so etcd's own import paths ("etcd/api/mvccpb/kv.proto") resolve with
proto/ as the include root. Only these are removed, nothing else is touched (field names,
numbers, packages and comments stay etcd's, so the wire format and gRPC paths are etcd's):
  * `import "gogoproto/gogo.proto";` and the `option (gogoproto.*) = ...;` file options
    (Go code-generation hints for gogo/protobuf; no effect on the wire);
  * `import "google/api/annotations.proto";`, its "// for grpc-gateway" comment, and every
    `option (google.api.http) = { ... };` method option (grpc-gateway's JSON/HTTP mapping,
    which fenced does not serve); a method left with an empty body becomes `{}`.
The script refuses a file in which any other `gogoproto`/`google.api`/`openapiv2` reference
remains, so a new kind of option is noticed rather than silently kept or dropped.
"""
import os
import re
import subprocess
import sys

FILES = [
    "api/etcdserverpb/rpc.proto",
    "api/mvccpb/kv.proto",
    "api/authpb/auth.proto",
    "server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
    "server/etcdserver/api/v3election/v3electionpb/v3election.proto",
    "LICENSE",
]


def strip(text: str, path: str) -> str:
    text = re.sub(r'^import "gogoproto/gogo\.proto";\n', "", text, flags=re.M)
    text = re.sub(r"^// for grpc-gateway\n", "", text, flags=re.M)
    text = re.sub(r'^import "google/api/annotations\.proto";\n', "", text, flags=re.M)
    text = re.sub(r"^option \(gogoproto\.[a-z_]+\) = (true|false);\n", "", text, flags=re.M)
    # option (google.api.http) = { ... }; with nested additional_bindings { ... } blocks.
    out, i = [], 0
    pat = re.compile(r"[ \t]*option \(google\.api\.http\) = \{")
    while True:
        m = pat.search(text, i)
        if not m:
            out.append(text[i:])
            break
        out.append(text[i:m.start()])
        depth, j = 0, m.end() - 1
        while True:
            c = text[j]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        j += 1
        assert text[j] == ";", f"{path}: expected ';' after http option"
        j += 1
        if text[j] == "\n":
            j += 1
        i = j
    text = "".join(out)
    # `rpc X(A) returns (B) {\n  }` -> `rpc X(A) returns (B) {}`
    text = re.sub(r"(\brpc [^\n]*\)) \{\n\s*\}", r"\1 {}", text)
    # Collapse the blank lines left where imports/options were (at most one in a row).
    text = re.sub(r"\n{3,}", "\n\n", text)
    for bad in ("gogoproto", "google.api", "google/api", "openapiv2"):
        assert bad not in text, f"{path}: {bad} still referenced"
    return text


def main() -> None:
    git_dir, tag = sys.argv[1], sys.argv[2]
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "proto", "etcd")
    for f in FILES:
        raw = subprocess.run(
            ["git", "--git-dir", git_dir, "show", f"{tag}:{f}"],
            check=True, capture_output=True, text=True,
        ).stdout
        dst = os.path.join(root, f)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "w") as fh:
            fh.write(raw if f == "LICENSE" else strip(raw, f))


if __name__ == "__main__":
    main()
