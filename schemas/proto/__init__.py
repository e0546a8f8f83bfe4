"""The gRPC contract: .proto files and their generated Python code (see generate.sh).

Import the generated modules as `schemas.proto.ragstream.retrieval.v1.retrieval_pb2` (and
`..._pb2_grpc`); the wire package stays `ragstream.retrieval.v1`.
"""
