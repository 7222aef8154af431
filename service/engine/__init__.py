"""The engine both front doors call: a request planned, admitted and queued once (`engine`), the task pipelines
that turn requests into model rows and rows into answers (`pipelines`), the dynamic batcher (`batcher`) and the
door that bounds the work a process takes on (`admission`)."""
