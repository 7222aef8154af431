"""The hostile profile: what a hostile client can make the server hold or do, each phase with a bound it must keep
(`profile` runs the phases, `cases` builds the requests, `checks` judges them, `net` speaks raw HTTP and gRPC)."""
