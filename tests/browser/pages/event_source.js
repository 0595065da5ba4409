// A plain EventSource on the URL given (tests/browser/test_browser_event_source.py), run
// in a page of another origin: it records every event the way an application sees it
// (its type, lastEventId, data) and every open and error, in window.record.
const url = arguments[0];
const record = { events: [], opens: [], errors: [], sources: 1 };
window.record = record;
const source = new EventSource(url);
window.source = source;
const keep = (e) => record.events.push({
  type: e.type, id: e.lastEventId, data: JSON.parse(e.data), at: performance.now(),
});
source.onmessage = keep;
for (const name of ["subscribe", "deny", "sync", "resync", "close"]) {
  source.addEventListener(name, keep);
}
source.onopen = () => { record.opens.push(performance.now()); };
source.onerror = () => { record.errors.push([source.readyState, performance.now()]); };
