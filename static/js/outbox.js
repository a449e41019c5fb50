/* Outbox: the delivery lag chart (mean and max per minute over the last hour). */
(function () {
  "use strict";
  const lag = JSON.parse(document.getElementById("lag-data").textContent);
  const x = lag.minutes.map(BP.plotlyLocal);
  Plotly.react(document.getElementById("lag-chart"), [
    { type: "bar", name: "delivered", x, y: lag.delivered, yaxis: "y2", marker: { color: "#d7deec" },
      hovertemplate: "%{y} delivered<extra>%{x}</extra>" },
    { type: "scatter", mode: "lines+markers", name: "mean lag", x, y: lag.mean_seconds, connectgaps: false,
      line: { color: "#2f5bd3" }, marker: { size: 4 }, hovertemplate: "mean %{y:.3f} s<extra>%{x}</extra>" },
    { type: "scatter", mode: "lines", name: "max lag", x, y: lag.max_seconds, connectgaps: false,
      line: { color: "#d62728", dash: "dot" }, hovertemplate: "max %{y:.3f} s<extra>%{x}</extra>" },
  ], {
    margin: { l: 56, r: 56, t: 8, b: 36 }, legend: { orientation: "h", y: 1.12 },
    xaxis: { type: "date" }, yaxis: { title: { text: "seconds" }, rangemode: "tozero" },
    yaxis2: BP.countAxis(lag.delivered, { title: { text: "delivered" }, overlaying: "y", side: "right",
                                          showgrid: false }),
  }, { displaylogo: false, responsive: true });
})();
