"""Spillway's load-benchmark helpers, shared by the benches under bench/ (bench/README.md).

Modules (standard library only, except `plot`, which needs matplotlib, and `dynamo_model`,
which needs tokenizers):

  http         raw HTTP/1.1 requests, the SSE de-chunker, a small GET
  loadgen      the open/closed-loop request runner and the single-prompt load generator
  analysis     a load-generator run's figures over its measured window
  mockmodel    the capacity of `spillway mock-engine` from its time model
  stats        percentiles, medians, slopes
  markdown     cells and tables, and the comparison of regenerated tables
  results      result files: the header, .md, .json, the load generator's records
  metrics      Prometheus dumps and process logs
  wrk          wrk / wrk2 / oha output
  plot         matplotlib, headless
  dynamo_model a word-level tokenizer folder for NVIDIA Dynamo's mocker

`python3 -m spillbench` (bench/lib on PYTHONPATH) runs the command-line helpers.
"""
