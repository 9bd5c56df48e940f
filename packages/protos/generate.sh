#!/bin/sh
# Generates the TypeScript for every .proto under protos/ into src/gen.
# The output is build output: it is ignored by git and nobody edits it.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$here/src/gen"
rm -rf "$out"
mkdir -p "$out"
include=/usr/include
[ -f "$include/google/protobuf/descriptor.proto" ] || {
  echo "generate.sh: google/protobuf/*.proto not found under $include; install Debian's libprotobuf-dev (make deps does)" >&2
  exit 1
}
protoc \
  --plugin=protoc-gen-ts_proto="$here/node_modules/.bin/protoc-gen-ts_proto" \
  --ts_proto_out="$out" \
  --ts_proto_opt=outputServices=grpc-js,env=node,esModuleInterop=true,forceLong=number,useOptionals=messages \
  -I "$root/protos" -I "$include" \
  $(cd "$root/protos" && find . -name '*.proto' | sed 's|^\./||' | sort)
