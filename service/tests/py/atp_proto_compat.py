"""Descriptor-level wire compatibility of our atp.v1 protos with the reference.

Compiles the vendored reference protos (service/tests/atp-reference) and the
repository's proto/atp/v1 to descriptor sets with grpc_tools.protoc, then
checks that every message, field (name, number, type, label, type_name), enum
value, service and RPC (input/output types, streaming) of the reference exists
unchanged in ours, and that every library encodes our signed messages in the
same order (number order: a reference client writes our extra fields, unknown
to it, after its own; prost writes a oneof where its lowest tag is). Prints
each problem and what ours adds.

Usage: atp_proto_compat.py [--ours INCLUDE_DIR]
  INCLUDE_DIR holds atp/v1/*.proto (default: the repository's proto/).
  Exit 0: compatible; 1: a difference.
"""

import argparse
import glob
import os
import sys
import tempfile

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
REFERENCE = os.path.join(ROOT, "service", "tests", "atp-reference")
OURS = os.path.join(ROOT, "proto")

FDP = descriptor_pb2.FieldDescriptorProto
TYPE_NAMES = {v: k for k, v in FDP.Type.items()}
LABEL_NAMES = {v: k for k, v in FDP.Label.items()}


def descriptor_set(include: str, out_dir: str, tag: str) -> descriptor_pb2.FileDescriptorSet:
    files = sorted(os.path.relpath(p, include) for p in glob.glob(os.path.join(include, "atp", "v1", "*.proto")))
    if not files:
        raise SystemExit(f"no atp/v1/*.proto under {include}")
    out = os.path.join(out_dir, f"{tag}.pb")
    args = ["grpc_tools.protoc", f"-I{include}", f"--descriptor_set_out={out}", "--include_imports", *files]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {include}")
    fds = descriptor_pb2.FileDescriptorSet()
    with open(out, "rb") as f:
        fds.ParseFromString(f.read())
    return fds


def index(fds: descriptor_pb2.FileDescriptorSet):
    """Full name -> descriptor for messages (nested too), enums and services."""
    messages, enums, services = {}, {}, {}

    def walk(prefix, msgs, enum_types):
        for e in enum_types:
            enums[f"{prefix}.{e.name}"] = e
        for m in msgs:
            name = f"{prefix}.{m.name}"
            messages[name] = m
            walk(name, m.nested_type, m.enum_type)

    for f in fds.file:
        prefix = f".{f.package}" if f.package else ""
        walk(prefix, f.message_type, f.enum_type)
        for s in f.service:
            services[f"{prefix}.{s.name}"] = s
    return messages, enums, services


def field_shape(f) -> dict:
    return {
        "name": f.name,
        "number": f.number,
        "type": TYPE_NAMES[f.type],
        "label": LABEL_NAMES[f.label],
        "type_name": f.type_name,
    }


def oneof_of(m, f):
    """The real (non-synthetic) oneof a field belongs to, or None."""
    if not f.HasField("oneof_index") or f.proto3_optional:
        return None
    return m.oneof_decl[f.oneof_index].name


def describe(f) -> str:
    kind = f.type_name or TYPE_NAMES[f.type][5:].lower()
    if f.label == FDP.LABEL_REPEATED:
        return f"repeated {kind}"
    return f"optional {kind}" if f.proto3_optional else kind


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", default=OURS, help="include dir holding atp/v1/*.proto (default: %(default)s)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="atp-compat-") as tmp:
        ref = descriptor_set(REFERENCE, tmp, "reference")
        ours = descriptor_set(os.path.abspath(args.ours), tmp, "ours")
    r_msgs, r_enums, r_svcs = index(ref)
    o_msgs, o_enums, o_svcs = index(ours)
    diffs, hazards, adds, notes = [], [], [], []

    for name, rm in sorted(r_msgs.items()):
        om = o_msgs.get(name)
        if om is None:
            diffs.append(f"message {name}: missing in ours")
            continue
        o_fields = {f.number: f for f in om.field}
        r_numbers = {f.number for f in rm.field}
        for rf in rm.field:
            of = o_fields.get(rf.number)
            if of is None:
                diffs.append(f"field {name}.{rf.name} = {rf.number}: missing in ours")
                continue
            want, got = field_shape(rf), field_shape(of)
            for k in want:
                if want[k] != got[k]:
                    diffs.append(f"field {name}.{rf.name} = {rf.number}: {k} {want[k]!r} in the reference, {got[k]!r} in ours")
            if oneof_of(rm, rf) != oneof_of(om, of):
                diffs.append(f"field {name}.{rf.name} = {rf.number}: oneof {oneof_of(rm, rf)!r} in the reference, {oneof_of(om, of)!r} in ours")
            if rf.proto3_optional != of.proto3_optional:
                notes.append(f"field {name}.{rf.name} = {rf.number}: explicit presence (optional) {rf.proto3_optional} -> {of.proto3_optional} (same wire format)")
        for of in om.field:
            if of.number not in r_numbers:
                adds.append(f"field {name}.{of.name} = {of.number} ({describe(of)})")
                # A reference client keeps our extra fields as unknown ones and
                # writes them after its known ones; that is number order (the
                # order prost signs in) only if every addition comes after
                # every reference field.
                if r_numbers and of.number < max(r_numbers):
                    hazards.append(
                        f"field {name}.{of.name} = {of.number}: added below the reference's highest number "
                        f"{max(r_numbers)}, so a reference client's re-encoding of a signed {name} would not be in number order"
                    )
        r_reserved = {(r.start, r.end) for r in rm.reserved_range}
        for rr in r_reserved - {(r.start, r.end) for r in om.reserved_range}:
            diffs.append(f"message {name}: reserved range {rr} missing in ours")
    for name in sorted(set(o_msgs) - set(r_msgs)):
        adds.append(f"message {name} ({len(o_msgs[name].field)} fields)")
    for name, om in sorted(o_msgs.items()):
        # prost encodes a oneof at the position of its lowest tag; a field
        # numbered between the oneof's tags would make prost's order differ
        # from every other library's (number order), breaking signatures.
        for i, decl in enumerate(om.oneof_decl):
            tags = [f.number for f in om.field if f.HasField("oneof_index") and f.oneof_index == i and not f.proto3_optional]
            between = [f.name for f in om.field if tags and min(tags) < f.number < max(tags) and f.number not in tags]
            if between:
                hazards.append(f"oneof {name}.{decl.name}: fields {between} numbered between its tags {min(tags)}..{max(tags)}")

    for name, re_ in sorted(r_enums.items()):
        oe = o_enums.get(name)
        if oe is None:
            diffs.append(f"enum {name}: missing in ours")
            continue
        o_vals = {v.name: v.number for v in oe.value}
        o_nums = {v.number: v.name for v in oe.value}
        r_names = {v.name for v in re_.value}
        for v in re_.value:
            if v.name not in o_vals:
                diffs.append(f"enum value {name}.{v.name} = {v.number}: missing in ours")
            elif o_vals[v.name] != v.number:
                diffs.append(f"enum value {name}.{v.name}: number {v.number} in the reference, {o_vals[v.name]} in ours")
            elif o_nums.get(v.number) != v.name:
                diffs.append(f"enum value {name}.{v.name} = {v.number}: ours names {v.number} {o_nums.get(v.number)!r}")
        for v in oe.value:
            if v.name not in r_names:
                adds.append(f"enum value {name}.{v.name} = {v.number}")
    for name in sorted(set(o_enums) - set(r_enums)):
        adds.append(f"enum {name} ({len(o_enums[name].value)} values)")

    for name, rs in sorted(r_svcs.items()):
        os_ = o_svcs.get(name)
        if os_ is None:
            diffs.append(f"service {name}: missing in ours")
            continue
        o_methods = {m.name: m for m in os_.method}
        for rm in rs.method:
            om = o_methods.get(rm.name)
            if om is None:
                diffs.append(f"rpc {name}/{rm.name}: missing in ours")
                continue
            for k in ("input_type", "output_type", "client_streaming", "server_streaming"):
                if getattr(rm, k) != getattr(om, k):
                    diffs.append(f"rpc {name}/{rm.name}: {k} {getattr(rm, k)!r} in the reference, {getattr(om, k)!r} in ours")
        r_names = {m.name for m in rs.method}
        for om in os_.method:
            if om.name not in r_names:
                stream = lambda on, t: f"stream {t}" if on else t  # noqa: E731
                adds.append(f"rpc {name}/{om.name}({stream(om.client_streaming, om.input_type)}) returns ({stream(om.server_streaming, om.output_type)})")
    for name in sorted(set(o_svcs) - set(r_svcs)):
        adds.append(f"service {name} ({len(o_svcs[name].method)} rpcs)")

    n_fields = sum(len(m.field) for m in r_msgs.values())
    n_values = sum(len(e.value) for e in r_enums.values())
    n_rpcs = sum(len(s.method) for s in r_svcs.values())
    print(
        f"reference: {len(r_msgs)} messages, {n_fields} fields, {len(r_enums)} enums, {n_values} enum values, "
        f"{len(r_svcs)} services, {n_rpcs} rpcs"
    )
    for a in adds:
        print(f"ours adds: {a}")
    for n in notes:
        print(f"note: {n}")
    for d in diffs:
        print(f"DIFFERENCE: {d}")
    for h in hazards:
        print(f"SIGNING ORDER: {h}")
    if diffs or hazards:
        print(f"INCOMPATIBLE: {len(diffs)} difference(s) from the reference, {len(hazards)} signing-order problem(s)")
        return 1
    print(f"compatible: every reference message, field, enum value, service and rpc is unchanged in ours ({len(adds)} additions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
