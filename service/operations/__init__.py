"""What operating the server needs beside the requests: structured logs, Prometheus metrics, tracing, named
worker threads, the container healthcheck and the port check."""
