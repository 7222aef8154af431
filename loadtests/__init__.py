"""Load tests: locust users for the REST and gRPC front doors, the `bertserve loadtest` runner, and a naive peer.

Everything here talks to the service over the wire only (HTTP and gRPC); the runner may start it as a
subprocess with `bertserve serve`. Load is only ever sent to loopback addresses (see `loadtests.loopback`).
Reference: https://docs.locust.io/en/stable/ (request events, FastHttpUser, load shapes, CSV output).
"""
