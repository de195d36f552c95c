// Loopback round trip after the caller computed for `gap` us, as ggml-rpc makes it: the caller
// hands the request to a dispatcher thread (condition variable, as rpc_dispatcher) or sends it
// itself; the server (another process) blocks in recv or spins on a non-blocking recv.
// usage: pp MODE_SERVER(block|spin) MODE_CLIENT(direct|dispatch) N
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
#include <string>
#include <future>
#include <queue>
using clk = std::chrono::steady_clock;
static double now_us() { return std::chrono::duration<double, std::micro>(clk::now().time_since_epoch()).count(); }
static bool recv_all(int fd, char * b, size_t n, bool spin) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, b + got, n - got, spin ? MSG_DONTWAIT : 0);
        if (r < 0 && spin && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (r <= 0) return false;
        got += r;
    }
    return true;
}
static void busy(double us) { double end = now_us() + us; while (now_us() < end) {} }
int main(int argc, char ** argv) {
    bool srv_spin = std::string(argv[1]) == "spin";
    bool dispatch = std::string(argv[2]) == "dispatch";
    int N = atoi(argv[3]);
    int ls = socket(AF_INET, SOCK_STREAM, 0); int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{}; a.sin_family = AF_INET; a.sin_addr.s_addr = htonl(INADDR_LOOPBACK); a.sin_port = 0;
    bind(ls, (sockaddr *)&a, sizeof a); listen(ls, 1); socklen_t al = sizeof a; getsockname(ls, (sockaddr *)&a, &al);
    pid_t pid = fork();
    if (pid == 0) {
        int c = accept(ls, nullptr, nullptr); setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char b[16];
        while (recv_all(c, b, 16, srv_spin)) send(c, b, 16, 0);
        _exit(0);
    }
    int s = socket(AF_INET, SOCK_STREAM, 0); connect(s, (sockaddr *)&a, sizeof a);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::mutex m; std::condition_variable cv; std::queue<std::promise<void> *> q; bool stop = false;
    std::thread disp;
    if (dispatch) disp = std::thread([&] {
        for (;;) {
            std::promise<void> * p;
            { std::unique_lock<std::mutex> l(m); cv.wait(l, [&] { return !q.empty() || stop; }); if (stop) return; p = q.front(); q.pop(); }
            char b[16] = {0}; send(s, b, 16, 0); recv_all(s, b, 16, false); p->set_value();
        }
    });
    std::vector<double> gaps = {0, 200, 1000, 5000};
    std::vector<std::vector<double>> rt(gaps.size());
    for (int i = 0; i < N * (int)gaps.size(); i++) {
        size_t g = i % gaps.size(); busy(gaps[g]);
        double t = now_us();
        if (dispatch) {
            std::promise<void> p; auto f = p.get_future();
            { std::lock_guard<std::mutex> l(m); q.push(&p); } cv.notify_all(); f.wait();
        } else { char b[16] = {0}; send(s, b, 16, 0); recv_all(s, b, 16, false); }
        rt[g].push_back(now_us() - t);
    }
    if (dispatch) { { std::lock_guard<std::mutex> l(m); stop = true; } cv.notify_all(); disp.join(); }
    close(s); waitpid(pid, nullptr, 0);
    for (size_t g = 0; g < gaps.size(); g++) {
        auto & v = rt[g]; std::sort(v.begin() + 0, v.end());
        printf("server %-5s client %-8s gap %5.0f us: rtt median %7.1f us  p90 %7.1f  max %8.1f\n", argv[1], argv[2], gaps[g],
               v[v.size() / 2], v[v.size() * 9 / 10], v.back());
    }
}
