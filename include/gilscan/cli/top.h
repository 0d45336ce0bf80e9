// `gilscan top`: a live view of a running Python's threads and GIL.
//
//   gilscan top -p PID                 attach (until q, Ctrl-C, --duration or its exit)
//   gilscan top -- python3 app.py      run it, watched (q or Ctrl-C: the program gets SIGINT)
//   gilscan top --batch --duration 10 -p PID    plain snapshots, for logs
//
// It records what `gilscan record --gil` records (and --blame's CPU samples
// and stacks unless --no-blame) with perf writing pipe mode into a pipe
// (record.h: record_live), and analyses that stream as it comes on a
// thread of its own (pipeline.h: AnalysisOptions::input_fd): the memory is
// the stages' (threads, GILs, blamed stacks), not the recording's. Every
// interval the view (output/top_view.h) shows the figures up to the latest
// event the analysis has, or, once the stream is found empty, up to the
// last ping perf is seen to have acted on (pipeline.h: LiveAnalysis; perf
// is pinged every 100 ms to write out its buffers: record_run.h, flushed_to).
#pragma once

namespace gilscan {

int top_main(int argc, char** argv);

}  // namespace gilscan
