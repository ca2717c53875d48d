#include <cstdio>
int main() { std::puts("tandem " TANDEM_VERSION); return 0; }
