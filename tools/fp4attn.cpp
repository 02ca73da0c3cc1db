// fp4attn command-line tool (placeholder until the CLI lands).
#include <cstdio>
int main() {
  std::puts("fp4attn: CLI not built yet");
  return 1;
}
