// Export spans with the official OpenTelemetry JavaScript SDK, as a Node agent would.
//
//   node export_spans.js '{"exporter": "proto|http|grpc", "url": "...", "compression": "gzip"|"none",
//                          "service": "...", "spans": N, "attributes": {...}, "headers": {...}}'
//
// BatchSpanProcessor (what Node agent stacks use), then forceFlush() and shutdown(). Every span
// gets `attributes` plus `js.index` = its number. Exits 1 if any export reported a failure
// (the processor itself only logs them); prints {"exported": n, "failed": n} on success.
"use strict";

const { diag, DiagConsoleLogger, DiagLogLevel } = require("@opentelemetry/api");
const { BasicTracerProvider, BatchSpanProcessor } = require("@opentelemetry/sdk-trace-base");
const { resourceFromAttributes } = require("@opentelemetry/resources");

const EXPORTERS = {
  proto: "@opentelemetry/exporter-trace-otlp-proto", // OTLP/HTTP protobuf
  http: "@opentelemetry/exporter-trace-otlp-http", // OTLP/HTTP JSON
  grpc: "@opentelemetry/exporter-trace-otlp-grpc",
};

async function main() {
  const options = JSON.parse(process.argv[2]);
  diag.setLogger(new DiagConsoleLogger(), DiagLogLevel.WARN);
  const { OTLPTraceExporter } = require(EXPORTERS[options.exporter]);
  const exporter = new OTLPTraceExporter({
    url: options.url,
    compression: options.compression || "none",
    headers: options.headers || {},
    timeoutMillis: 20000,
  });
  const counts = { exported: 0, failed: 0, errors: [] };
  const exportOnce = exporter.export.bind(exporter);
  exporter.export = (spans, done) =>
    exportOnce(spans, (result) => {
      if (result.code === 0) counts.exported += spans.length;
      else {
        counts.failed += spans.length;
        counts.errors.push(String(result.error));
      }
      done(result);
    });
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ "service.name": options.service }),
    spanProcessors: [new BatchSpanProcessor(exporter, { maxExportBatchSize: options.batch || 512 })],
  });
  const tracer = provider.getTracer("lightning-otel-interop");
  for (let i = 0; i < options.spans; i++) {
    const span = tracer.startSpan(`js-span-${i}`, { attributes: { ...options.attributes, "js.index": i } });
    span.end();
  }
  await provider.forceFlush();
  await provider.shutdown();
  console.log(JSON.stringify(counts));
  process.exit(counts.failed === 0 && counts.exported === options.spans ? 0 : 1);
}

main().catch((error) => {
  console.error(error);
  process.exit(2);
});
